"""What the kernel tests expect of a kernel asked to continue a CRC-32C over the codes it writes."""

from __future__ import annotations

import crc32c


def check_kernel_crc(got: int, codes, start: int, kern) -> None:
    """``got``, the CRC a kernel of module ``kern`` returned after writing ``codes`` from the
    running CRC ``start``: the CRC-32C of the codes' bytes continued from ``start``; a kernel
    that cannot form it (-1) is allowed only off the CPU or on a CPU without the instruction
    (codec/kernels/cpu/_crc.py, ``HARDWARE``)."""
    from codec.kernels.cpu import _crc

    want = crc32c.crc32c(codes.tobytes(), start)
    fused = kern.__name__.startswith("codec.kernels.cpu.") and _crc.HARDWARE
    assert got == want if fused else got in (-1, want), (got, want)
