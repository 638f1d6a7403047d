"""Parameters of the export model: filled now (dygraph use, tests) or deferred and streamed to disk.

Every weight of the export model is a Paddle parameter made by `make_param(layer, value)`, where
value is a numpy array or a `Lazy` one (shape and dtype known, data computed on demand). Outside
`deferred()` the parameter gets its data at once. Inside `deferred()` (the exporter), parameters
are created under `paddle.LazyGuard` (no memory) and recorded by name; `save_streamed` then
saves the program with `paddle.jit.save` minus its parameter file, and writes that file itself
(pdiparams.py), computing one tensor at a time. So exporting a model needs memory for its
largest tensor, not for the model (the real DeepSeek-V3 rank of TP8 holds ~80 GB).

The saved files are byte-identical to `paddle.jit.save` of the same model built eagerly
(tests/test_export_stream.py), except that ops carry no `struct_name` (an AutoParallel debug tag whose
recording is quadratic in the program's size); the Python stack Paddle records for each new op (for
error messages, not saved) is skipped unless DSX_DEBUG is set, and each parameter is made with a startup program of
its own (Paddle copies the startup program's whole parameter table into the main program at every new parameter:
quadratic in their count). Paddle 3.3.1 internals bypassed for the program-only save (`pir_io.save_vars_pir`,
`DenseTensor._share_data_with`, `layers.name_struct`, `pir.core.create_parameter`'s startup program) are looked up and
checked first, so a Paddle that moved them gives a clear error instead of a wrong file.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError

PADDLE_DTYPES = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16",
                 np.dtype(np.float16): "float16", np.dtype(np.int8): "int8",
                 np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn"}


class Lazy:
    """An array known by shape and dtype; `load()` computes it (each call computes it again)."""

    __slots__ = ("shape", "dtype", "fn")

    def __init__(self, shape, dtype, fn: Callable[[], np.ndarray]):
        self.shape, self.dtype, self.fn = tuple(int(d) for d in shape), np.dtype(dtype), fn

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def load(self) -> np.ndarray:
        a = np.ascontiguousarray(self.fn())
        if a.shape != self.shape or a.dtype != self.dtype:
            raise DsxError(f"internal: a deferred tensor produced {a.dtype} {list(a.shape)}, "
                           f"declared {self.dtype} {list(self.shape)}")
        return a

    def map(self, shape, fn: Callable[[np.ndarray], np.ndarray], dtype=None) -> "Lazy":
        """A Lazy of fn(this array)."""
        return Lazy(shape, self.dtype if dtype is None else dtype, lambda: fn(self.load()))

    def __repr__(self) -> str:
        return f"Lazy({self.dtype}, {list(self.shape)})"


def load(x):
    return x.load() if isinstance(x, Lazy) else x


def derive(x, shape, fn: Callable[[np.ndarray], np.ndarray], dtype=None):
    """fn(x), now for an array, deferred for a Lazy (shape/dtype: the result's)."""
    return x.map(shape, fn, dtype) if isinstance(x, Lazy) else fn(x)


# ------------------------------------------------------------ parameters ----

_deferred: dict[str, Lazy | np.ndarray] | None = None


@contextlib.contextmanager
def deferred():
    """Build a model whose parameters are recorded (name -> value), not filled; yields that dict."""
    import paddle

    global _deferred
    if _deferred is not None:
        raise DsxError("internal: deferred() does not nest")
    _deferred = {}
    try:
        with paddle.utils.unique_name.guard(), paddle.LazyGuard():
            yield _deferred
    finally:
        _deferred = None


def _tensor(arr: np.ndarray):
    import paddle

    arr = np.ascontiguousarray(arr)
    if arr.dtype == ml_dtypes.float8_e4m3fn:
        return paddle.to_tensor(arr.view(np.uint8)).view(paddle.float8_e4m3fn)
    if arr.dtype == ml_dtypes.bfloat16:
        return paddle.to_tensor(arr.astype(np.float32)).astype("bfloat16")  # bf16 values: exact
    return paddle.to_tensor(arr)


def make_param(layer, value):
    """A parameter of `layer` holding value (array or Lazy) exactly, in its own dtype; no gradient."""
    from paddle import nn

    dt = np.dtype(value.dtype)
    try:
        pdt = PADDLE_DTYPES[dt]
    except KeyError:
        raise DsxError(f"internal: no Paddle parameter dtype for {dt}") from None
    p = layer.create_parameter(list(value.shape), dtype=pdt, default_initializer=nn.initializer.Constant(0.0))
    p.stop_gradient = True
    if _deferred is not None:
        _deferred[p.name] = value
    else:
        p.set_value(_tensor(load(value)))
    return p


# ----------------------------------------------------------------- saving ----

def _internals():
    """The Paddle internals a program-only jit.save needs, checked."""
    import paddle.nn.layer.layers as layers
    import paddle.pir.core as pcore
    import paddle.static.pir_io as pio
    from paddle.base import core

    if (not callable(getattr(pio, "save_vars_pir", None)) or not hasattr(core.DenseTensor, "_share_data_with")
            or not callable(getattr(layers, "name_struct", None))
            or not all(callable(getattr(pcore, f, None)) for f in ("create_parameter", "switch_startup_program"))):
        import paddle

        raise DsxError(f"Paddle {paddle.__version__}: streamed export needs paddle.static.pir_io.save_vars_pir, "
                       "DenseTensor._share_data_with, paddle.nn.layer.layers.name_struct and paddle.pir.core's "
                       "create_parameter and switch_startup_program (Paddle 3.3.1 has them)",
                       hint="install paddlepaddle==3.3.1 (pyproject pins it)")
    return pio, core, layers, pcore


def _no_name_struct(prefix=None):
    return contextlib.nullcontext()


def _no_stack(f=None, limit=None):
    return traceback.StackSummary()


def _own_startup(pcore, create_parameter):
    """create_parameter, each parameter made in a startup program of its own. Paddle's makes it in the default
    startup program, then replaces the main program's parameter table with a copy of that program's whole table
    (`set_parameters_from`), only so that the main program's builtin.parameter op can read the new one's type: a copy
    per parameter of every parameter so far, quadratic (R1's rank 0 has ~43,000: minutes). With a startup program of
    its own the copy is the one entry the op reads. The table is not saved: `pir_io` lists a program's parameters by
    its ops (the saved bytes are the same, tests/test_export_stream.py)."""

    def create(*args, **kwargs):
        prev = pcore.switch_startup_program(pcore.Program())
        try:
            return create_parameter(*args, **kwargs)
        finally:
            pcore.switch_startup_program(prev)

    return create


def save_streamed(layer, prefix: str | Path, input_spec: list, values: dict,
                  written: Callable[[int], None] | None = None, hashed: Callable[[str], None] | None = None) -> int:
    """paddle.jit.save(layer, prefix) for a layer built under deferred(): PREFIX.json from Paddle,
    PREFIX.pdiparams written here tensor by tensor in Paddle's order (written(n): each one's bytes; hashed(hex): the
    parameter file's sha256 as written). Returns the parameter bytes."""
    import paddle

    from ds_export.export.pdiparams import write_params

    pio, core, layers, pcore = _internals()
    seen: list[tuple[str, tuple, str]] = []

    def program_only(dirname=None, main_program=None, vars=None, filename=None):  # noqa: A002
        params, opt = pio.get_pir_parameters(main_program)
        seen.extend((v.name, tuple(v.shape), str(v.dtype)) for v in params + opt if v.persistable)

    real_save, real_share, real_struct = pio.save_vars_pir, core.DenseTensor._share_data_with, layers.name_struct
    real_stack, real_create = traceback.extract_stack, pcore.create_parameter
    pio.save_vars_pir = program_only
    pcore.create_parameter = _own_startup(pcore, real_create)
    core.DenseTensor._share_data_with = lambda self, src: None  # no data to share: nothing is initialized
    # Layer.__call__ tags each new op with its layer path ("struct_name", for AutoParallel) by listing
    # every op of the program before and after the call: quadratic in the program's size (R1's 256
    # experts x 58 layers: hours). Inference does not read the tag; without it the save is linear.
    layers.name_struct = _no_name_struct
    # Each new op also records the Python stack that made it (traceback.extract_stack, ~0.5 ms an op,
    # a third of R1's program build), for error messages only: it is not saved. DSX_DEBUG keeps it.
    if not os.environ.get("DSX_DEBUG"):
        traceback.extract_stack = _no_stack
    try:
        paddle.jit.save(layer, str(prefix), input_spec=input_spec)
    finally:
        pio.save_vars_pir, core.DenseTensor._share_data_with = real_save, real_share
        layers.name_struct, traceback.extract_stack = real_struct, real_stack
        pcore.create_parameter = real_create
    names = sorted({n for n, _, _ in seen})  # save_combine's order
    missing = [n for n in names if n not in values]
    if missing:
        raise DsxError(f"internal: program parameters {missing[:3]} were not made by make_param")
    return write_params(str(prefix) + ".pdiparams",
                        ((n, (lambda v=values[n]: load(v)), values[n].shape, values[n].dtype) for n in names),
                        written=written, hashed=hashed)
