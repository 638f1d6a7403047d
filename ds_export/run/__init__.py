"""`dsx run`: a deployment recipe, end to end (download -> quantize -> export -> verify -> generate)."""
