"""Frozen frames: written once, and decoded by every later version to the same arrays.

Single-tensor frames (format v1): NAME.frame, NAME.npy (the decoded array), NAME.json.
Many-tensor frames (format v2): NAME.many, NAME.npz (the decoded tensors, in layout order,
as ``t0``, ``t1``, ...), NAME.json (the spec, the tensors' names or none, their dtypes; a
hash-form frame is decoded with the layout read off the stored tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import codec as _codec
from codec.dtypes import bfloat16, resolve_dtype
from codec.testing.arrays import same as _same
from codec.testing.checks import _get

__all__ = ["write_fixture", "check_fixture", "write_many_fixture", "check_many_fixture"]

def write_fixture(directory, name: str, codec, arr: np.ndarray) -> None:
    """Freeze ``codec``'s frame of ``arr`` as NAME.frame plus the decoded array NAME.npy."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frame = _get(codec).encode(arr)
    (directory / f"{name}.frame").write_bytes(frame)
    dec = _codec.decode(frame)
    np.save(directory / f"{name}.npy", _stored(dec))
    (directory / f"{name}.json").write_text(json.dumps({"spec": _get(codec).spec, "dtype": dec.dtype.name}) + "\n")


def check_fixture(directory, name: str) -> None:
    """A frozen frame (from an older version) still decodes to the stored array, bit for bit."""
    directory = Path(directory)
    meta = json.loads((directory / f"{name}.json").read_text())
    frame = (directory / f"{name}.frame").read_bytes()
    want = _loaded(np.load(directory / f"{name}.npy"), meta["dtype"])
    got = _codec.decode(frame)
    assert _same(got, want), f"fixture {name} ({meta['spec']}): decodes differently than when it was frozen"


def _stored(a: np.ndarray) -> np.ndarray:
    """``a`` as a fixture stores it: bfloat16 (which .npy files cannot name) as its uint16 bits."""
    return a.view(np.uint16) if a.dtype == bfloat16 else a


def _loaded(a: np.ndarray, dtype_name: str) -> np.ndarray:
    """A stored array back in the dtype its JSON names (:func:`_stored`'s inverse)."""
    return a.view(resolve_dtype(dtype_name))


def write_many_fixture(directory, name: str, codec, tensors, *, layout: str = "table", joint: bool = False) -> None:
    """Freeze ``codec``'s many-tensor frame of ``tensors`` (a dict or a list, as
    ``encode_many`` takes them) as NAME.many, with its decoded tensors (NAME.npz) and NAME.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    c = _get(codec)
    frame = bytes(c.encode_many(tensors, layout=layout, joint=joint))
    (directory / f"{name}.many").write_bytes(frame)
    names = list(tensors) if isinstance(tensors, dict) else None
    arrays = list(tensors.values()) if names is not None else list(tensors)
    lay = _codec.Layout.of(tensors)
    dec = _codec.decode_many(frame, layout=lay)
    dec = list(dec.values()) if isinstance(dec, dict) else dec
    np.savez(directory / f"{name}.npz", **{f"t{i}": _stored(d) for i, d in enumerate(dec)})
    meta = {"spec": c.spec, "form": layout, "joint": joint, "names": names, "dtypes": [a.dtype.name for a in arrays], "shapes": [list(a.shape) for a in arrays]}
    (directory / f"{name}.json").write_text(json.dumps(meta) + "\n")


def check_many_fixture(directory, name: str) -> None:
    """A frozen many-tensor frame (from an older version) still decodes to the stored tensors,
    bit for bit: with nothing but the frame (table form), or with the layout (hash form)."""
    directory = Path(directory)
    meta = json.loads((directory / f"{name}.json").read_text())
    frame = (directory / f"{name}.many").read_bytes()
    with np.load(directory / f"{name}.npz") as z:
        want = [_loaded(z[f"t{i}"], dt) for i, dt in enumerate(meta["dtypes"])]
    zeros = [np.zeros(shape, resolve_dtype(dt)) for shape, dt in zip(meta["shapes"], meta["dtypes"])]
    tensors = dict(zip(meta["names"], zeros)) if meta["names"] is not None else zeros
    got = _codec.decode_many(frame, layout=_codec.Layout.of(tensors) if meta["form"] == "hash" else None)
    got = list(got.values()) if isinstance(got, dict) else got
    assert len(got) == len(want), f"fixture {name} ({meta['spec']}): {len(got)} tensors, frozen with {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert _same(g, w), f"fixture {name} ({meta['spec']}): tensor {i} decodes differently than when it was frozen"
