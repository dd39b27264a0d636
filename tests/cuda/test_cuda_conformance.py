"""The device conformance check (``codec.testing.check_device``) on every registered stage id
and every pipeline of the conformance suite, with the float16, float32 and float64 sample
arrays of at most 420 values:
every codec has a CUDA path and gives the host's frames, decodes and error-feedback steps
(fft within its documented tolerance, ``codec.testing.device_tolerance``)."""

from __future__ import annotations

import numpy as np
import pytest

from codec.stage import registered
from codec.testing import PIPELINES, check_device, sample_arrays

#: the sample arrays that run: empty, 0-d, one value, a 4-D one (AdaComp's convolution bins),
#: zeros, and a float64 and a float16 one of odd size (the simulator runs about 6,000 threads
#: a second, so the 527-value 2-D ones are left to tests/test_conformance.py on the host)
ARRAYS = [a for a in sample_arrays() if a.dtype in (np.float16, np.float32, np.float64) and a.size <= 420]
#: a pipeline composes stages whose edge sizes (0-d, one value, ...) its registered ids run
#: above: the pipelines take the empty, the 4-D, the float64 and the float16 arrays
PIPELINE_ARRAYS = [a for a in ARRAYS if a.size == 0 or a.ndim == 4 or a.dtype != np.float32]
TAKEN = set()


@pytest.mark.parametrize("spec", sorted(registered()) + list(PIPELINES))
def test_device_conformance(spec):
    took = [check_device(spec, a) for a in (ARRAYS if spec in registered() else PIPELINE_ARRAYS)]
    assert len(set(took)) == 1, f"{spec}: took some device arrays and refused others"
    if took[0]:
        TAKEN.add(spec)


def test_every_codec_takes_device_arrays():
    """Every registered codec took them (run after the above): the sparsifiers, the 16-bit
    floats, every quantizer, fft and powersgd."""
    if not TAKEN:
        pytest.skip("run with test_device_conformance")
    assert set(registered()) <= TAKEN, set(registered()) - TAKEN
