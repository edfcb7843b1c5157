"""A small safetensors reader with the standard library only (no numpy, no torch): for
looking at exported weights and comparing them in tests.

The format: an 8-byte little-endian header length N, N bytes of JSON (name -> {"dtype",
"shape", "data_offsets": [begin, end]}, optional "__metadata__"), then the raw little-endian
data. Every offset and size is checked against the file; a bad file raises StreambpError
(DATA_LOSS) naming the problem.
"""
from __future__ import annotations

import array
import json
import math
import struct
import sys
from dataclasses import dataclass
from typing import Dict, List, Tuple, Union

import grpc

from .errors import StreambpError

__all__ = ["Tensor", "load_safetensors", "parse_safetensors"]

# dtype -> (bytes per element, array typecode or "" when decoded by hand)
_DTYPES: Dict[str, Tuple[int, str]] = {
    "F64": (8, "d"), "F32": (4, "f"), "F16": (2, ""), "BF16": (2, ""),
    "I64": (8, "q"), "I32": (4, "i"), "I16": (2, "h"), "I8": (1, "b"), "U8": (1, "B"), "BOOL": (1, "B"),
}


@dataclass(frozen=True)
class Tensor:
    """One tensor: its safetensors dtype, shape and values (flat, row-major, as Python numbers)."""
    dtype: str
    shape: List[int]
    values: Union[List[float], List[int]]

    @property
    def numel(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)


def _bad(what: str) -> StreambpError:
    return StreambpError(grpc.StatusCode.DATA_LOSS, "safetensors: " + what)


def _decode(dtype: str, raw: bytes) -> Union[List[float], List[int]]:
    size, code = _DTYPES[dtype]
    if code:
        values = array.array(code)
        values.frombytes(raw)
        if sys.byteorder != "little":
            values.byteswap()
        return values.tolist()
    if dtype == "F16":
        return [v[0] for v in struct.iter_unpack("<e", raw)]
    # BF16: the upper half of a float32.
    return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]


def parse_safetensors(data: bytes) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """The tensors (by name) and the ``__metadata__`` of a safetensors file's bytes."""
    if len(data) < 8:
        raise _bad(f"{len(data)} bytes is too short for the header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise _bad(f"header length {n} is past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(f"the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad("the header is not a JSON object")
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors: Dict[str, Tensor] = {}
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _bad(f"{name}: expected dtype, shape and data_offsets [begin, end]") from None
        if dtype not in _DTYPES:
            raise _bad(f"{name}: unknown dtype {dtype}")
        if any(d < 0 for d in shape):
            raise _bad(f"{name}: negative dimension in shape {shape}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(body)):
            raise _bad(f"{name}: data_offsets [{begin}, {end}] outside the data ({len(body)} bytes)")
        if end - begin != math.prod(shape) * _DTYPES[dtype][0]:
            raise _bad(f"{name}: {end - begin} bytes for shape {shape} of {dtype}")
        tensors[name] = Tensor(dtype, shape, _decode(dtype, bytes(body[begin:end])))
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def load_safetensors(path: str) -> Dict[str, Tensor]:
    """The tensors of a safetensors file, by name."""
    with open(path, "rb") as f:
        return parse_safetensors(f.read())[0]
