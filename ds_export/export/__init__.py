"""`dsx export`: DeepSeek-V3 as Paddle inference Layers (weights -> modeling -> MTP draft).

- `weights.py`: a checkpoint read into exported-layout numpy arrays (FP8 dequantized, MLA absorbed).
- `modeling.py`: the Paddle model and its one step function over a latent KV cache.
- `mtp.py`: the MTP draft Layer with its own latent cache.
- `quant_layers.py`, `ops.py`: quantized Linears (weight-only int8/int4, block FP8) through the dsx
  Paddle custom operators (ops/dsx_paddle_ops.cc over the csrc CPU kernels), built once and cached.
- `exporter.py` / `runtime.py`: `dsx export` (paddle.jit.save) and `dsx generate` (Paddle Inference).

The math and every layout are described in docs/export-model.md.
"""
