"""Conformance checks every codec must pass (ours and third parties').

Modelled on numcodecs' ``check_encode_decode`` / ``check_config`` /
``check_backwards_compatibility``: import this module in a test suite and call
:func:`check_codec` (or the individual checks) with a codec and a few arrays.  Each check
raises ``AssertionError`` with a sentence saying what broke.

    from codec.testing import check_codec, sample_arrays
    for arr in sample_arrays():
        check_codec("fp16", arr)
"""

from __future__ import annotations

import numpy as np

from codec.testing.arrays import DTYPES, PIPELINES, assert_identical, diff_msg, sample_arrays, ulp
from codec.testing.checks import (
    check_config,
    check_decode_add,
    check_decode_out,
    check_encode_decode,
    check_encode_out,
    check_error_feedback,
)
from codec.testing.fixtures import check_fixture, check_many_fixture, write_fixture, write_many_fixture
from codec.testing.malformed import check_malformed


def check_device(codec, arr: np.ndarray, steps: int = 2) -> bool:
    """:func:`codec.testing.device.check_device` (imported on call: it needs Numba's CUDA target)."""
    from codec.testing.device import check_device as check

    return check(codec, arr, steps)


def device_tolerance(codec):
    """:func:`codec.testing.device.device_tolerance`: None when ``codec``'s device frames are
    the host's byte for byte, else how far their decodes may be apart (relative to the input)."""
    from codec.testing.device import device_tolerance as tolerance

    return tolerance(codec)


__all__ = [
    "sample_arrays",
    "ulp",
    "diff_msg",
    "assert_identical",
    "check_codec",
    "check_encode_decode",
    "check_decode_out",
    "check_encode_out",
    "check_decode_add",
    "check_config",
    "check_error_feedback",
    "check_malformed",
    "check_device",
    "device_tolerance",
    "check_fixture",
    "check_many_fixture",
    "write_fixture",
    "write_many_fixture",
    "DTYPES",
    "PIPELINES",
]


def check_codec(codec, arr: np.ndarray, *, n_random: int = 1000) -> None:
    """Every check above on one array."""
    check_encode_decode(codec, arr)
    check_decode_out(codec, arr)
    check_encode_out(codec, arr)
    check_decode_add(codec, arr)
    check_config(codec)
    check_error_feedback(codec, arr)
    check_malformed(codec, arr, n_random=n_random)
