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


def test_device_crc_joins_groups(monkeypatch):
    """More whole chunks than a group: the device fold, then the host's join of the groups."""
    monkeypatch.setattr(_crc, "GROUP", 2)
    data = np.random.default_rng(5).integers(0, 256, 5 * _crc.CHUNK + 3, dtype=np.uint8)
    assert _crc.crc32c(cuda.to_device(data), 77) == ref.crc32c(data.tobytes(), 77)
