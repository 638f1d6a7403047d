"""How long `dsx export` takes to build and save the inference program at DeepSeek-R1's real layout.

    python bench/export_program.py [--layers 8] [--tp 8] [--workdir /tmp/dsx-export-bench] [--no-anchor]

The checkpoint is a header-faithful sparse copy of R1 (ds_export/data/deepseek-r1: 163 shards, 91,991
tensors, no data on disk). Rank 0 of `--tp` is built from its first `--layers` decoder layers
(0 = all 61) the way the exporter builds it (parameters deferred), and its program is saved the way
`dsx export` saves it; the parameter file is not written (the tensors would be zeros read from
holes), its bytes are counted. Anchor, same run and same model: Paddle's own jit.save, which tags
every op with its layer path by listing the whole program around each layer call. Prints seconds,
peak RSS and the program's size for both, and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("GLOG_minloglevel", "2")


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def save_program(part, out: Path, stock_tagging: bool) -> tuple[float, int, int]:
    """(seconds, program bytes, parameter bytes) of the exporter's program save of `part`."""
    from ds_export.export import params as P
    from ds_export.export import pdiparams
    from ds_export.export.modeling import DeepseekV3ForInference

    counted = []

    def count_only(path, tensors, *, written=None, **_):
        n = 0
        for _name, _load, shape, dtype in tensors:
            size = 1
            for d in shape:
                size *= int(d)
            n += size * dtype.itemsize
            if written is not None:
                written(size * dtype.itemsize)
        counted.append(n)
        return n

    real_write, real_no_struct = pdiparams.write_params, P._no_name_struct
    pdiparams.write_params = count_only
    if stock_tagging:
        import paddle.nn.layer.layers as layers

        P._no_name_struct = layers.name_struct  # leave Paddle's own per-layer op tagging on
    try:
        with P.deferred() as values:
            model = DeepseekV3ForInference(part, 4096)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        P.save_streamed(model, out / "model", model.input_spec(), values)
        dt = time.perf_counter() - t0
    finally:
        pdiparams.write_params, P._no_name_struct = real_write, real_no_struct
    return dt, (out / "model.json").stat().st_size, counted[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8, help="first N decoder layers (0 = all 61)")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-export-bench"))
    ap.add_argument("--no-anchor", action="store_true", help="skip Paddle's stock save (slow: quadratic)")
    a = ap.parse_args()

    from ds_export.export.tp import shard_weights
    from ds_export.export.weights import load_weights
    from ds_export.io.checkpoint import Checkpoint
    from ds_export.run.metadata import BUNDLED, sparse_from_metadata

    src = a.workdir / "DeepSeek-R1"
    if not src.exists():
        sparse_from_metadata(BUNDLED["deepseek-ai/DeepSeek-R1"], src)
    with Checkpoint.open(src) as ck:
        w = load_weights(ck, "bfloat16", include_mtp=False, lazy=True)
    if a.layers:
        w.layers = w.layers[: a.layers]
    moe = sum(1 for lw in w.layers if lw.moe)
    part = shard_weights(w, 0, a.tp)
    print(f"R1 layout, rank 0 of tp {a.tp}: {len(w.layers)} layers ({moe} MoE, "
          f"{len(w.layers[-1].experts)} experts each)", flush=True)
    rows = []
    for name, stock in (("dsx export", False),) + ((("paddle jit.save (anchor)", True),) if not a.no_anchor else ()):
        with contextlib.redirect_stderr(open(os.devnull, "w")):  # Paddle's dy2static warnings
            dt, prog, par = save_program(part, a.workdir / ("stock" if stock else "dsx"), stock)
        rows.append((name, dt, prog, par))
        print(f"{name:<26} {dt:9.1f} s  program {prog / 2**20:8.1f} MiB  parameters {par / 2**30:7.1f} GiB  "
              f"peak RSS {rss_mib():7.0f} MiB", flush=True)
    if len(rows) == 2:
        print(f"anchor / dsx: {rows[1][1] / rows[0][1]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
