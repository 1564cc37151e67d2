"""openpi's wire format: msgpack messages whose numpy arrays (and scalars) travel as maps
{b"__ndarray__": True, b"data": raw bytes, b"dtype": typestr, b"shape": [...]} (and
{b"__npgeneric__": True, b"data": value, b"dtype": typestr}). Torch-free: the client imports it."""

from __future__ import annotations

import msgpack
import numpy as np

UNSUPPORTED_KINDS = "VOc"  # structured, object and complex arrays do not travel


def _encode(value):
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in UNSUPPORTED_KINDS:
        raise TypeError(f"arrays of dtype {value.dtype} cannot be sent")
    if isinstance(value, np.ndarray):
        data, shape = value.tobytes(), value.shape
        return {b"__ndarray__": True, b"data": data, b"dtype": value.dtype.str, b"shape": shape}
    if isinstance(value, np.generic):
        return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
    raise TypeError(f"cannot send a {type(value).__name__}")


def _decode(value: dict):
    if b"__ndarray__" in value:
        dtype = np.dtype(value[b"dtype"])
        if dtype.kind in UNSUPPORTED_KINDS:
            raise ValueError(f"arrays of dtype {dtype} are not accepted")
        return np.ndarray(buffer=value[b"data"], dtype=dtype, shape=value[b"shape"])
    if b"__npgeneric__" in value:
        return np.dtype(value[b"dtype"]).type(value[b"data"])
    return value


def pack(message) -> bytes:
    return msgpack.packb(message, default=_encode)


def unpack(data: bytes):
    return msgpack.unpackb(data, object_hook=_decode)
