"""The output formats, one registered object each: what tensors a source weight becomes.

A `Format` names a target type (`keep`, `bf16`, `float32`, `a8w8_fp8`,
`weight_only_int8`, `weight_only_int4`) and says, from shapes alone, which
tensors it writes (name suffix, safetensors dtype, shape). The arithmetic lives
in the format modules (`fp8_block`, `weight_only`, `bf16`), each with a numpy
reference (`*_ref`) and a compiled fast path (`*_native`) tested bit for bit.
The planner, the converter and `dsx verify` all ask this registry, so a format
is described once. Adding a format: docs/adding-a-format.md (a module here, a
kernel in csrc/cpu, a test, and one `register(...)` line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ds_export.formats import fp8_block, weight_only

# (suffix, safetensors dtype, shape) of each output tensor; suffix "" is the weight itself.
Outputs = list[tuple[str, str, tuple[int, ...]]]


@dataclass(frozen=True)
class Format:
    name: str
    linear_only: bool  # applies to 2-D Linear weights only
    outputs: Callable[[tuple[int, ...], str, int, int], Outputs]  # (shape, src dtype, group, arch)
    bits: int | None = None  # weight-only formats


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    FORMATS[fmt.name] = fmt
    return fmt


def get(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known: {', '.join(FORMATS)}") from None


def _fp8_outputs(shape, src_dtype, group, arch) -> Outputs:
    ps = fp8_block.packed_shapes(shape[0], shape[1])
    return [("", "F8_E4M3", tuple(ps["weight"]["shape"])),
            (fp8_block.SCALE_SUFFIX, "F32", tuple(ps["weight_scale_inv"]["shape"]))]


def _wo(bits: int):
    def outputs(shape, src_dtype, group, arch) -> Outputs:
        ps = weight_only.packed_shapes(shape[0], shape[1], bits, group, arch)
        return [("", "I8", tuple(ps["qweight"]["shape"])), ("_scale", "BF16", tuple(ps["scale"]["shape"]))]
    return outputs


register(Format("keep", False, lambda shape, src, g, a: [("", src, tuple(shape))]))
register(Format("bf16", False, lambda shape, src, g, a: [("", "BF16", tuple(shape))]))
register(Format("float32", False, lambda shape, src, g, a: [("", "F32", tuple(shape))]))
register(Format("a8w8_fp8", True, _fp8_outputs))
register(Format("weight_only_int8", True, _wo(8), bits=8))
register(Format("weight_only_int4", True, _wo(4), bits=4))
