"""`dsx export`: DeepSeek-V3 as Paddle inference Layers (weights -> modeling -> MTP draft).

- `weights.py`: a checkpoint read into exported-layout numpy arrays (FP8 dequantized, MLA absorbed).
- `modeling.py`: the Paddle model and its one step function over a latent KV cache.
- `mtp.py`: the MTP draft Layer with its own latent cache.

The math and every layout are described in docs/export-model.md.
"""
