"""``none``: MPI Allreduce (SUM) of the dense arrays, the baseline (docs/transport.md, "Schemes").

One nonblocking ``Iallreduce`` per accumulator dtype (:class:`~transport.schemes.base.Sums`),
then one division (when averaging) and one rounding per tensor.  NaN and inf are summed like
any other value, as MPI Allreduce and DDP do.
"""

from __future__ import annotations

import time

from codec.dtypes import on_device
from transport.schemes.base import Scheme, Sums, finish_device, finish_sum, vote_error

__all__ = ["Dense"]


class Dense(Scheme):
    """``none``: MPI Allreduce (SUM) of the dense arrays (:class:`Sums`).  Device tensors are
    summed from device buffers by a CUDA-aware MPI and finished on the device; otherwise
    they cross to pinned host memory and their sums come back (transport/device.py)."""

    devices = True

    def __init__(self, codec_or_spec, reducer):
        super().__init__(codec_or_spec, reducer)
        if reducer.vote:
            raise vote_error(self.spec)

    @classmethod
    def takes(cls, stages) -> bool:
        """``none`` alone: a bytes stage (``none+zstd``, ``none+crc32``) needs frames, so
        those specs run the allgather of lossless frames."""
        return len(stages) == 1

    def start(self, prepared, stats):
        arrays, _ = prepared
        return _DensePending(self, arrays, Sums(self.reducer.comm, arrays).start(arrays, stats))


class _DensePending:
    def __init__(self, scheme, arrays, sums):
        self.scheme, self.arrays, self.sums = scheme, arrays, sums
        self.wire = [a.nbytes for a in arrays]

    def test(self):
        return self.sums.test()

    def finish(self, stats, out):
        summed = self.sums.wait()
        t = time.perf_counter()
        red = self.scheme.reducer
        if self.arrays and on_device(self.arrays[0]):
            res = [finish_device(s, a, red, o) for a, s, o in zip(self.arrays, summed, out)]
            stats.decode_s = time.perf_counter() - t
            return res
        # views of the reduced buffers (rounded copies for 16-bit tensors), or the caller's arrays
        res = [finish_sum(s, a.dtype, red.size, red.average, out=o).reshape(a.shape) for a, s, o in zip(self.arrays, summed, out)]
        stats.decode_s = time.perf_counter() - t
        return res
