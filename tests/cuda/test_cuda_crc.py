"""CRC-32C of device memory (codec/kernels/cuda/_crc.py) against the crc32c package: sizes
around the chunk and the group, every start value."""

from __future__ import annotations

import crc32c as ref
import numpy as np
import pytest
from numba import cuda

from codec.kernels.cuda import _crc


@pytest.mark.parametrize("start", (0, 1, 0xFFFFFFFF, 0x12345678))
@pytest.mark.parametrize("n", (0, 1, 7, _crc.CHUNK - 1, _crc.CHUNK, _crc.CHUNK + 1, 3 * _crc.CHUNK + 5))
def test_device_crc_matches_the_package(n, start):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert _crc.crc32c(cuda.to_device(data), start) == ref.crc32c(data.tobytes(), start)


@pytest.mark.parametrize("chunk_bits,group", [(10, 2), (8, 3), (6, 64), (12, 1)])
def test_device_crc_joins_groups(chunk_bits, group):
    """Chunk sizes and groups (more whole chunks than a group: the device fold, then the
    host's join of the groups): the same value."""
    data = np.random.default_rng(5).integers(0, 256, 5 * _crc.CHUNK + 3, dtype=np.uint8)
    assert _crc.crc32c(cuda.to_device(data), 77, chunk_bits, group) == ref.crc32c(data.tobytes(), 77)


@pytest.mark.parametrize("offset", (0, 3))
@pytest.mark.parametrize("n", (7, 255, 256, 257, 4 * 256 + 13))
def test_device_crc_regions(offset, n):
    """The region kernel (small regions here: 8 threads of 4 words, 256 bytes), on data that
    starts on no multiple of 8 (a device frame's payload starts where its header ends):
    the unaligned head, the regions and the tail join to the package's value."""
    data = np.random.default_rng(n + offset).integers(0, 256, offset + n, dtype=np.uint8)
    got = _crc.crc32c(cuda.to_device(data)[offset:], 99, chunk_bits=6, group=2, threads=8, per=4)
    assert got == ref.crc32c(data[offset:].tobytes(), 99)


def test_device_crc_region_shapes():
    """Another block width (32 threads of 2 words: a deeper xor tree) gives the same value."""
    data = np.random.default_rng(3).integers(0, 256, 3 * 512 + 5, dtype=np.uint8)
    assert _crc.crc32c(cuda.to_device(data)[1:], 5, threads=32, per=2) == ref.crc32c(data[1:].tobytes(), 5)
