"""The container oracle: unpack_frames, pack back to the same bytes, every frame as a frame."""

from __future__ import annotations

from codec import container as _container
from codec.fuzzing.checksums import CFLAG_CRC32C
from codec.fuzzing.findings import Finding, Outcome, _Calls
from codec.fuzzing.oracles.frame import check_frame


def check_container(data, calls: _Calls) -> Outcome:
    items, err = calls.call("unpack_frames", _container.unpack_frames, data)
    if err is not None:
        return Outcome("rejected", type(err).__name__)
    if not isinstance(items, list) or any(not isinstance(n, str) or not isinstance(f, memoryview) for n, f in items):
        raise Finding("unpack_frames returned something else than [(str, memoryview)]")
    flagged = bool(bytes(data[5:6]) and data[5] & CFLAG_CRC32C)
    again, _ = calls.call("pack_frames", _container.pack_frames, items, checksum=flagged, expect=())
    if again != bytes(data):
        raise Finding("an accepted container does not pack back to the same bytes")
    labels = []
    for _, f in items:
        labels.append(check_frame(f, calls, extras=False).label)
    return Outcome("ok", "ok" if not labels else "ok+" + "/".join(sorted(set(labels))))
