"""``.safetensors`` files, parsed and written here (the ``safetensors`` package's NumPy loader
has no BF16).  The layout and the checks made before any tensor is built are in
:mod:`codec.io`'s docstring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from codec.dtypes import bfloat16
from codec.io.common import TensorFileError, TensorNameError, one_line

DTYPES = {"F16": np.dtype("<f2"), "BF16": bfloat16, "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}
NAMES = {np.dtype(np.float16): "F16", bfloat16: "BF16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}
#: the longest header readers accept (and so this module writes)
MAX_HEADER = 100_000_000


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file, in the order of their data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 8:
            raise TensorFileError(f"{path}: {size} bytes is too short for a safetensors file (needs an 8-byte header length)")
        (n,) = np.frombuffer(f.read(8), "<u8")
        n = int(n)
        if n > size - 8 or n > MAX_HEADER:
            raise TensorFileError(f"{path}: header length {n} does not fit a {size}-byte safetensors file")
        head = f.read(n)

        def unique_object(pairs):
            out = {}
            for k, v in pairs:
                if k in out:
                    raise TensorFileError(f"{path}: safetensors header names {k!r} twice")
                out[k] = v
            return out

        try:
            meta = json.loads(head.decode("utf-8"), object_pairs_hook=unique_object)
        except TensorFileError:
            raise
        except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, too deep, a number too long
            raise TensorFileError(f"{path}: safetensors header is not valid JSON: {one_line(e)}") from None
        if not isinstance(meta, dict):
            raise TensorFileError(f"{path}: safetensors header is not a JSON object")
        data_len = size - 8 - n
        plan = []
        for name, entry in meta.items():
            if name == "__metadata__":
                continue
            plan.append(_entry(path, name, entry, data_len))
        plan.sort(key=lambda p: (p[2], p[3]))
        pos = 0
        for name, _, begin, end, _ in plan:
            if begin != pos:
                what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes before it"
                raise TensorFileError(f"{path}: tensor {name!r:.200} at data offset {begin} {what}")
            pos = end
        if pos != data_len:
            raise TensorFileError(f"{path}: tensors end at data offset {pos} but the data area is {data_len} bytes")
        data = bytearray(data_len)
        if f.readinto(data) != data_len:
            raise TensorFileError(f"{path}: file shrank while it was being read")
    out = {}
    for name, dt, begin, end, shape in plan:
        arr = np.frombuffer(data, dt, count=(end - begin) // dt.itemsize, offset=begin)
        if begin % dt.itemsize:  # unaligned: give kernels an aligned copy
            arr = arr.copy()
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        out[name] = arr.reshape(shape)
    return out


def _entry(path: Path, name, entry, data_len: int):
    where = f"{path}: tensor {name!r:.200}"
    if not isinstance(entry, dict):
        raise TensorFileError(f"{where}: header entry is not a JSON object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise TensorFileError(f"{where}: header entry has no dtype")
    if dtype not in DTYPES:
        raise TensorFileError(
            f"{where} has dtype {dtype!r:.40}; gradcodec handles {', '.join(DTYPES)} (float16, bfloat16, float32, float64) only"
        )
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise TensorFileError(f"{where}: shape {shape!r:.200} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise TensorFileError(f"{where}: data_offsets {offsets!r:.200} are not [begin, end] inside the {data_len}-byte data area")
    dt = DTYPES[dtype]
    need = math.prod(shape) * dt.itemsize
    if offsets[1] - offsets[0] != need:
        raise TensorFileError(f"{where}: {offsets[1] - offsets[0]} data bytes for shape {shape!r:.200} of {dtype} (needs {need})")
    return name, dt, offsets[0], offsets[1], tuple(shape)


def header(names, arrays) -> bytes:
    """The JSON header of ``arrays`` (padded to 8 bytes), or TensorNameError when it would be
    longer than readers accept."""
    head = {}
    pos = 0
    for name, arr in zip(names, arrays):
        head[name] = {"dtype": NAMES[arr.dtype], "shape": list(arr.shape), "data_offsets": [pos, pos + arr.nbytes]}
        pos += arr.nbytes
    text = json.dumps(head, separators=(",", ":")).encode("ascii")
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the reference writer does
    if len(text) > MAX_HEADER:
        raise TensorNameError(
            f"the .safetensors header of these {len(names)} tensors would be {len(text):,} bytes; readers refuse more than "
            f"{MAX_HEADER:,} (shorten the names, or use .npz)"
        )
    return text


def write_safetensors(f, head: bytes, arrays) -> None:
    f.write(len(head).to_bytes(8, "little"))
    f.write(head)
    for arr in arrays:
        f.write(arr.reshape(-1).view(np.uint8).data if arr.size else b"")
