"""What a value read from JSON or YAML is (config.json, manifests, indexes, recipes, gate files).

Python counts true and false as integers (isinstance(True, int)), and float() accepts "2.5" and "nan": a check
that a value is a count or a number goes through these, so that neither slips through.
"""

from __future__ import annotations

import math


def is_int(v) -> bool:
    """An integer, not a boolean."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A finite int or float, not a boolean (nor a string, nor NaN or infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
