"""JSON <-> numpy at the HTTP boundary: decode client arrays (nested lists or base64), describe gym spaces."""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Mapping

import numpy as np

from serving.config import B64_DTYPES
from serving.errors import unprocessable


def _compact_bound(a: np.ndarray) -> Any:
    """Box bounds for JSON: a scalar when uniform, null for +-inf (JSON has no infinity)."""
    arr = np.asarray(a)
    flat = arr.astype(np.float64).ravel()
    f32 = arr.dtype == np.float32

    def one(v: float) -> Any:
        if not math.isfinite(v):
            return None
        if float(v).is_integer():
            return int(v)
        # float32 bounds print as their shortest float32 repr (4.8, not 4.800000190734863).
        return float(np.format_float_positional(np.float32(v), unique=True)) if f32 else float(v)

    if flat.size and np.all(flat == flat[0]):
        return one(float(flat[0]))
    return [one(float(v)) for v in flat]


def space_to_json(space: Any) -> dict[str, Any]:
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _compact_bound(space.low),
            "high": _compact_bound(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": [int(n) for n in np.asarray(space.nvec).ravel()]}
    return {"type": type(space).__name__, "repr": repr(space)}


# --------------------------------------------------------------------------------------------- decoding


def decode_array(value: Any, what: str) -> np.ndarray:
    """JSON value -> numpy array, rejecting non-numeric and ragged input with a 422 naming the problem.

    Accepts nested lists of numbers, or {"b64": <base64>, "dtype": ..., "shape": [...]} for compact binary.
    """
    if isinstance(value, dict):
        return _decode_b64(value, what)
    if isinstance(value, (str, bool)) or value is None:
        raise unprocessable("bad_dtype", f"{what} must be an array of numbers, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        raise unprocessable("ragged_array", f"{what} is a ragged nested list (rows of different lengths)") from None
    kind = arr.dtype.kind
    if kind in "iuf":
        return arr
    if kind == "b":
        raise unprocessable("bad_dtype", f"{what} must hold numbers, not booleans")
    if kind == "O":
        raise unprocessable("ragged_array", f"{what} is ragged or mixes numbers with other values")
    raise unprocessable("bad_dtype", f"{what} must hold numbers, got {arr.dtype.kind!r}-kind values (strings?)")


def _decode_b64(value: Mapping[str, Any], what: str) -> np.ndarray:
    unknown = set(value) - {"b64", "dtype", "shape"}
    if unknown or "b64" not in value:
        raise unprocessable(
            "bad_encoding", f"{what}: an encoded array is {{'b64', 'dtype', 'shape'}}, got keys {sorted(value)}"
        )
    dtype = value.get("dtype", "float32")
    if dtype not in B64_DTYPES:
        raise unprocessable("bad_dtype", f"{what}: dtype {dtype!r} not one of {sorted(B64_DTYPES)}")
    shape = value.get("shape")
    if not (isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise unprocessable("bad_shape", f"{what}: 'shape' must be a list of non-negative integers")
    if not isinstance(value["b64"], str):
        raise unprocessable("bad_encoding", f"{what}: 'b64' must be a base64 string")
    try:
        raw = base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise unprocessable("bad_encoding", f"{what}: 'b64' is not valid base64") from None
    dt = np.dtype(dtype)
    expected = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(raw) != expected:
        raise unprocessable(
            "bad_shape", f"{what}: {len(raw)} bytes do not fill shape {shape} of {dtype} ({expected} bytes)"
        )
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
