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
