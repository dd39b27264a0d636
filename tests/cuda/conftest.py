"""Settings every simulator test of tests/cuda shares.

The simulator runs each CUDA thread as a Python thread, so a launch costs about as many
thread starts as it has threads, and a block-wide scan's barriers about 0.1 ms per thread.
Each block also pays a polling loop of the simulator's (measured: one fp16 conformance
check took 3.7 s with 14 blocks of 32 threads, 1.9 s with 2 blocks of 256, 0.41 s with one
block of 32). Here the grid-stride launches take one block of 32 threads
(``_common.THREADS``, ``_common.MAX_BLOCKS``: each thread strides over the array), and the
block-wide scans' blocks 4 threads of 128 values each (``SCAN_BLOCK``, ``SCAN_ITEMS``: a
few hundred values take one scan, and a barrier costs the simulator 20-30 ms
whatever the block's size: 420 values took 0.39 s in 8 threads of 16, 0.085 s in 4 of 128). The launch shape
never changes a result (grid-stride loops; scans in index order); the kernel tests run
other shapes on purpose (two and three blocks of 256 and 32 threads, 256- and 32-thread
scanning blocks, several stretches of a few values per thread). On a GPU (``GRADCODEC_CUDA_TESTS=1``) nothing of that is changed.
On both, a decode into a device array reads every index section on the device
(``codec.pack.DEVICE_SECTION``: the tests' sections are small).
"""

from __future__ import annotations

import sys

import numba
import pytest

from support import cudasim

#: the interpreter's thread switch interval in the simulator.  Its block manager polls its
#: threads in a loop that never sleeps, so a thread that waits (a barrier, a lock in a device
#: function's call) gets the interpreter back only when the poller's slice ends: 5 ms by
#: default.  Measured: a decode_add of 3,000 values into float16 (one ``_half_combine``
#: launch, 32 threads) took 119-125 s at 5 ms, 0.35 s at 0.5 ms (tests/support/cudasim.py).
SWITCH_INTERVAL = cudasim.SWITCH_INTERVAL
if numba.config.ENABLE_CUDASIM:
    sys.setswitchinterval(SWITCH_INTERVAL)


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    cudasim.apply(monkeypatch.setattr)  # (the shapes the scripts launched from here take too)


@pytest.fixture
def host_only():
    """The name of a stage without a CUDA path (every codec of the library has one): the
    recipe's ``int8`` (tests/recipe/), registered while the test runs."""
    import recipe

    with recipe.registered() as name:
        yield name
