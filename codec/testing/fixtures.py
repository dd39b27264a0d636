"""Frozen frames: written once, and decoded by every later version to the same array."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import codec as _codec
from codec.dtypes import bfloat16
from codec.testing.arrays import same as _same
from codec.testing.checks import _get

__all__ = ["write_fixture", "check_fixture"]

def write_fixture(directory, name: str, codec, arr: np.ndarray) -> None:
    """Freeze ``codec``'s frame of ``arr`` as NAME.frame plus the decoded array NAME.npy."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frame = _get(codec).encode(arr)
    (directory / f"{name}.frame").write_bytes(frame)
    dec = _codec.decode(frame)
    np.save(directory / f"{name}.npy", dec.view(np.uint16) if dec.dtype == bfloat16 else dec)
    (directory / f"{name}.json").write_text(json.dumps({"spec": _get(codec).spec, "dtype": dec.dtype.name}) + "\n")


def check_fixture(directory, name: str) -> None:
    """A frozen frame (from an older version) still decodes to the stored array, bit for bit."""
    directory = Path(directory)
    meta = json.loads((directory / f"{name}.json").read_text())
    frame = (directory / f"{name}.frame").read_bytes()
    want = np.load(directory / f"{name}.npy")
    if meta["dtype"] == "bfloat16":
        want = want.view(bfloat16)
    got = _codec.decode(frame)
    assert _same(got, want), f"fixture {name} ({meta['spec']}): decodes differently than when it was frozen"
