"""The one message a rank contributes per step: a small table of contents, then its frames.

    offset 0   4 bytes   magic b"GCM1"
    offset 4   uint32    count: how many frames follow (one per tensor, in the step's order)
    offset 8   count x uint64   the byte length of each frame
    then the frames back to back, no padding

All integers are little-endian.  Names, shapes and dtypes are not repeated: every frame
carries its own header, and the Allreducer checks before each step that every rank holds
the same tensors in the same order (docs/transport.md, "Message layout").
"""

from __future__ import annotations

import numpy as np

from codec import CorruptFrameError

MAGIC = b"GCM1"
#: bytes before the frame lengths
FIXED = 8


def pack(frames) -> np.ndarray:
    """One uint8 message holding ``frames`` (a sequence of bytes-like) behind the table of contents."""
    lengths = np.array([len(f) for f in frames], "<u8")
    head = FIXED + 8 * len(frames)
    msg = np.empty(head + int(lengths.sum()), np.uint8)
    msg[:4] = np.frombuffer(MAGIC, np.uint8)
    msg[4:8] = np.array([len(frames)], "<u4").view(np.uint8)
    msg[FIXED:head] = lengths.view(np.uint8)
    at = head
    for f, n in zip(frames, lengths.tolist()):
        msg[at : at + n] = np.frombuffer(f, np.uint8)
        at += n
    return msg


def unpack(msg, count: int, rank: int) -> list[memoryview]:
    """The ``count`` frames of one rank's message, as zero-copy views.

    Raises CorruptFrameError (naming ``rank``) when the magic, the count or the lengths do
    not match the message's real size: a frame is never read past its message."""
    view = memoryview(msg).cast("B")
    where = f"message from rank {rank}"
    if len(view) < FIXED or bytes(view[:4]) != MAGIC:
        raise CorruptFrameError(f"{where}: not a gradcodec transport message ({len(view)} bytes)")
    got = int(np.frombuffer(view[4:8], "<u4")[0])
    if got != count:
        raise CorruptFrameError(f"{where}: holds {got} frames, this step has {count} tensors")
    head = FIXED + 8 * count
    if len(view) < head:
        raise CorruptFrameError(f"{where}: {len(view)} bytes cannot hold the table of {count} frames")
    lengths = np.frombuffer(view[FIXED:head], "<u8")
    if int(lengths.sum(dtype=np.float64)) != len(view) - head or int(lengths.sum()) != len(view) - head:
        raise CorruptFrameError(f"{where}: frame lengths add up to {int(lengths.sum(dtype=np.float64))}, the message holds {len(view) - head}")
    out, at = [], head
    for n in lengths.tolist():
        out.append(view[at : at + n])
        at += n
    return out
