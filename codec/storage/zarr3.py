"""``GradcodecZarr``: any gradcodec spec as a zarr 3 array-to-bytes codec (``gradcodec``).

    >>> import zarr                                                              # doctest: +SKIP
    >>> from codec.storage.zarr3 import GradcodecZarr
    >>> z = zarr.create_array(store, shape=(1000, 512), chunks=(100, 512), dtype="float32",
    ...                       serializer=GradcodecZarr(spec="fp16"), compressors=None)

Each chunk is stored as one gradcodec frame (a chunk is an array: the codec codes it as
``encode`` does, its per-tensor semantics applying per chunk, e.g. top-k's k of the chunk).
It is the array's serializer, the place of zarr's ``bytes`` codec, since it turns an array
into bytes itself; byte-to-byte codecs (zstd, crc32c) may follow it.  The metadata holds
``{"name": "gradcodec", "configuration": {"spec": <canonical spec>, "checksum": <bool>}}``;
zarr finds the class by that name through the ``zarr.codecs`` entry point.  Float16,
float32 and float64 arrays (zarr has no bfloat16).  Lossy specs give back the decoded
values, as a lossy compressor does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.common import parse_named_configuration

from codec.dtypes import CODES
from codec.errors import CodecTypeError, CodecValueError
from codec.pipeline import get_codec

__all__ = ["GradcodecZarr"]

#: the name in zarr's metadata and in the ``zarr.codecs`` entry point
NAME = "gradcodec"


@dataclass(frozen=True)
class GradcodecZarr(ArrayBytesCodec):
    """A gradcodec spec as zarr 3's array-to-bytes codec: a chunk in, its frame out."""

    is_fixed_size = False

    spec: str = "fp16"
    checksum: bool = True

    def __init__(self, *, spec: str = "fp16", checksum: bool = True) -> None:
        if not isinstance(checksum, bool):
            raise CodecTypeError(f"checksum: expected True or False, got {checksum!r}")
        object.__setattr__(self, "spec", get_codec(spec).spec)
        object.__setattr__(self, "checksum", checksum)

    @classmethod
    def from_dict(cls, data):
        _, config = parse_named_configuration(data, NAME, require_configuration=False)
        return cls(**(config or {}))

    def to_dict(self):
        return {"name": NAME, "configuration": {"spec": self.spec, "checksum": self.checksum}}

    @property
    def _codec(self):
        return get_codec(self.spec, checksum=self.checksum)  # (cached by spec)

    def validate(self, *, shape, dtype, chunk_grid) -> None:
        native = np.dtype(dtype.to_native_dtype())
        if native.newbyteorder("=") not in CODES.values():
            raise CodecValueError(f"dtype: gradcodec codes float16, float32 or float64 arrays, not {native}")

    def compute_encoded_size(self, input_byte_length: int, chunk_spec) -> int:
        raise NotImplementedError  # (a frame's size depends on the spec and, for some, the values)

    async def _encode_single(self, chunk_array, chunk_spec):
        arr = np.ascontiguousarray(chunk_array.as_numpy_array())
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("="))
        return chunk_spec.prototype.buffer.from_bytes(bytes(self._codec.encode(arr)))

    async def _decode_single(self, chunk_bytes, chunk_spec):
        want = np.dtype(chunk_spec.dtype.to_native_dtype())
        out = np.empty(chunk_spec.shape, want.newbyteorder("="))
        self._codec.decode(chunk_bytes.as_numpy_array(), out=out)  # (the frame's dtype and size checked against the chunk's)
        return chunk_spec.prototype.nd_buffer.from_numpy_array(out if out.dtype == want else out.astype(want))
