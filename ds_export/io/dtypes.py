"""safetensors dtype names <-> numpy dtypes (fp8/bf16 through ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# safetensors name -> numpy dtype. numpy has no bf16/fp8: ml_dtypes provides them,
# and raw bytes are always available through a uint8 view.
ST_TO_NP: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
NP_TO_ST: dict[np.dtype, str] = {v: k for k, v in ST_TO_NP.items()}

# Short human names used in plans and reports.
SHORT = {"F32": "fp32", "BF16": "bf16", "F16": "fp16", "F8_E4M3": "fp8_e4m3", "F8_E5M2": "fp8_e5m2",
         "I8": "int8", "U8": "uint8", "I32": "int32", "I64": "int64", "F64": "fp64"}


def itemsize(st_dtype: str) -> int:
    return ST_TO_NP[st_dtype].itemsize


def to_st(dtype) -> str:
    """numpy dtype (or safetensors name) -> safetensors name."""
    if isinstance(dtype, str) and dtype in ST_TO_NP:
        return dtype
    dt = np.dtype(dtype)
    try:
        return NP_TO_ST[dt]
    except KeyError:
        raise ValueError(f"dtype {dt} has no safetensors name") from None


def nbytes(st_dtype: str, shape) -> int:
    n = itemsize(st_dtype)
    for d in shape:
        n *= int(d)
    return n
