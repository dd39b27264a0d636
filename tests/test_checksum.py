"""codec/checksum.py: the payload CRC-32C on several threads equals the one-call CRC-32C."""

from __future__ import annotations

import crc32c as ref
import numpy as np
import pytest

import codec
from codec import checksum, threads
from codec.frame import parse_frame


@pytest.mark.parametrize("seed", range(5))
def test_combine_is_the_crc_of_the_concatenation(seed):
    rng = np.random.default_rng(seed)
    for na, nb in [(0, 0), (0, 5), (5, 0), (1, 1), (3, 1000), (4096, 77), (int(rng.integers(1, 10**5)), int(rng.integers(1, 10**5)))]:
        a, b = rng.bytes(na), rng.bytes(nb)
        assert checksum.combine(ref.crc32c(a), ref.crc32c(b), nb) == ref.crc32c(a + b), (na, nb)


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_parallel_crc_equals_one_call(monkeypatch, count):
    monkeypatch.setattr(threads, "budget", lambda: count)
    rng = np.random.default_rng(count)
    for n in (0, 1, checksum.PARALLEL_MIN - 1, checksum.PARALLEL_MIN, checksum.PARALLEL_MIN + 12_345, 3 * checksum.PARALLEL_MIN + 7):
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        assert checksum.crc32c(buf) == ref.crc32c(buf), n
        assert checksum.crc32c(memoryview(buf)[1:]) == ref.crc32c(memoryview(buf)[1:]), n


def test_large_frames_carry_the_crc_of_their_payload(monkeypatch):
    monkeypatch.setattr(threads, "budget", lambda: 2)
    x = np.random.default_rng(0).standard_normal(checksum.PARALLEL_MIN // 2 + 999).astype(np.float32)
    for frame in (codec.get_codec("fp16").encode(x), codec.get_codec("fp16").encode_many([x, x[:5]])):
        if codec.inspect(frame)["format_version"] == 1:
            fr = parse_frame(frame)
            assert fr.checksum == "crc32c"
        mv = memoryview(frame)
        hl = codec.inspect(frame)["header_bytes"]
        crc_at = hl - 8
        assert int.from_bytes(mv[crc_at : crc_at + 4], "little") == ref.crc32c(mv[hl:])
        bad = bytearray(frame)
        bad[-3] ^= 1
        with pytest.raises(codec.CorruptFrameError, match="payload checksum"):
            (codec.decode if codec.inspect(frame)["format_version"] == 1 else codec.decode_many)(bytes(bad))


def test_a_forked_child_checksums_on_its_own_pool(monkeypatch):
    """The pool's threads do not survive fork(): a child starts its own (else it would wait
    forever on threads that do not exist)."""
    import os

    monkeypatch.setattr(threads, "budget", lambda: 2)
    buf = np.random.default_rng(9).integers(0, 256, checksum.PARALLEL_MIN + 1, dtype=np.uint8)
    want = ref.crc32c(buf)
    assert checksum.crc32c(buf) == want  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        os._exit(0 if checksum.crc32c(buf) == want else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_the_checksum_does_not_load_numba():
    """Asking the thread budget for a large payload's checksum must not import Numba (the
    lossless codec and inspect need no kernel)."""
    import subprocess
    import sys

    script = (
        "import sys, numpy as np, codec\n"
        "f = codec.get_codec('none').encode(np.ones(3_000_000, np.float32))\n"
        "codec.inspect(f); codec.frame.parse_frame(f)\n"
        "assert 'numba' not in sys.modules, 'numba was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
