"""``Gradcodec``: any gradcodec spec as a ``numcodecs.abc.Codec`` (codec id ``gradcodec``).

    >>> import numcodecs                                           # doctest: +SKIP
    >>> c = numcodecs.get_codec({"id": "gradcodec", "spec": "topk(ratio=0.01)+fp16"})

The encoded bytes are a gradcodec frame: self-describing (dtype, shape, the spec), so
``decode`` needs nothing else and ``codec.decode`` reads them too.  The config is flat JSON:
``{"id": "gradcodec", "spec": <canonical spec>, "dtype": <name>, "checksum": <bool>}``.
``dtype`` only says how to read an input that has no float dtype of its own (bytes, a
bytearray, an ``array.array``, an integer view): numcodecs hands codecs raw buffers too.  An
array of a supported float dtype is coded as it is.
"""

from __future__ import annotations

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy

from codec.dtypes import CODES, as_float_array, resolve_dtype
from codec.errors import CodecTypeError
from codec.pipeline import get_codec

__all__ = ["Gradcodec"]


class Gradcodec(Codec):
    """A gradcodec spec as a numcodecs codec: ``encode`` gives the frame, ``decode(buf,
    out=None)`` the array (into ``out`` when given: any buffer of its size), checking that
    the frame was made by this spec."""

    codec_id = "gradcodec"

    def __init__(self, spec: str = "fp16", dtype: str = "float32", checksum: bool = True):
        if not isinstance(checksum, bool):
            raise CodecTypeError(f"checksum: expected True or False, got {checksum!r}")
        self._codec = get_codec(spec, checksum=checksum)
        self.spec = self._codec.spec
        self.dtype = resolve_dtype(dtype).name
        self.checksum = checksum

    def encode(self, buf):
        arr = buf if isinstance(buf, np.ndarray) and buf.dtype in CODES.values() else as_float_array(ensure_contiguous_ndarray(buf), self.dtype, "buf")
        return bytes(self._codec.encode(arr))

    def decode(self, buf, out=None):
        dec = self._codec.decode(ensure_contiguous_ndarray(buf).reshape(-1).view(np.uint8))  # (any buffer's bytes: an array.array('b') too)
        return dec if out is None else ndarray_copy(dec, out)

    def get_config(self) -> dict:
        return {"id": self.codec_id, "spec": self.spec, "dtype": self.dtype, "checksum": self.checksum}

    def __repr__(self) -> str:
        return f"Gradcodec(spec={self.spec!r}, dtype={self.dtype!r}, checksum={self.checksum!r})"
