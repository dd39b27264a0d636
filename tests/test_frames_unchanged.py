"""Frames, decodes and error-feedback residuals stay byte-identical across refactors.

tests/fixtures/frame_hashes.json holds, for every registered codec id and every pipeline of
``codec.testing.PIPELINES`` on fixed inputs (every dtype, edge sizes, arrays that span several
65,536-element chunks), a SHA-256 over: the bare frames at steps 0 and 7 under two keys, their
decodes, and three error-feedback steps (frames and residuals).  The file was written before
the "one contract per layer" refactor (issue 14) from main at ad26bf8 and is never regenerated:
a change of any byte here is a format change and must be documented, not re-recorded.

PowerSGD's frames hold BLAS matrix products, whose last bits depend on the kernels OpenBLAS
picks for the CPU (AVX-512 "SkylakeX" kernels on the machine that recorded the file, AVX2
"Haswell"/"Zen" ones on an AMD EPYC, ...).  tests/fixtures/frame_hashes_blas.json holds the
other variants, recorded from the same commit (ad26bf8) on one machine with
``OPENBLAS_CORETYPE`` set to each of Haswell, Zen, Sandybridge, SkylakeX and CooperLake; a
spec's hashes must equal one recorded variant as a whole.

A deliberate change of a codec's frames is a documented format change: it is appended to
tests/fixtures/frame_changes.json (never edited), one entry per change with its reason, the
section of docs/format.md ("Changes") that documents it, and the new hashes of the specs it
changed; a spec's hashes must then equal the record, a BLAS variant or a documented change.

    python tests/test_frames_unchanged.py --write   # only to create the file, never to update it
    python tests/test_frames_unchanged.py --change "why (docs/format.md, Changes)" SPEC...   # append one change
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import codec
from codec.dtypes import bfloat16
from codec.testing import PIPELINES

HASHES = Path(__file__).with_name("fixtures") / "frame_hashes.json"
#: spec -> [{"openblas_coretype": [...], "hashes": [...]}]: the BLAS-dependent variants
BLAS_VARIANTS = HASHES.with_name("frame_hashes_blas.json")
#: [{"change": why, "specs": {spec: hashes}}]: the documented format changes, in order
CHANGES = HASHES.with_name("frame_changes.json")


def changed(spec: str) -> list[list[str]]:
    """The hashes documented format changes gave ``spec`` (oldest first)."""
    if not CHANGES.exists():
        return []
    return [c["specs"][spec] for c in json.loads(CHANGES.read_text()) if spec in c["specs"]]


def narrowed(a: np.ndarray, dtype) -> np.ndarray:
    """float64 ``a`` cast to ``dtype`` as the recorded inputs were: NumPy's cast, through
    float32 first for bfloat16.  ml_dtypes before 0.7 cast float64 to bfloat16 that way
    (rounding twice); 0.7 rounds once, which would change these inputs, not the codecs."""
    return a.astype(np.float32).astype(dtype) if np.dtype(dtype) == bfloat16 else a.astype(dtype)


def inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(20261125)
    heavy = (rng.standard_t(2, size=200_003) * 1e-3).astype(np.float32)
    arrays = [
        np.zeros((0,), np.float32),
        np.array([-2.5], np.float32),
        (rng.standard_normal((13, 37)) * 0.01).astype(np.float32),
        heavy,
        heavy[:131_073].astype(np.float64),
        heavy[:70_001].astype(np.float16),
        heavy[:70_001].astype(bfloat16),
        (rng.standard_t(3, size=(7, 11, 5)) * 1e-2).astype(np.float16),
        narrowed(rng.standard_normal(999) * 1e-3, bfloat16),
    ]
    return arrays


def specs() -> list[str]:
    return sorted({c["id"] for c in codec.list_codecs()} | set(PIPELINES))


def digest(spec: str, x: np.ndarray) -> str:
    h = hashlib.sha256()

    def put(tag, data):
        h.update(tag.encode())
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).view(np.uint8).tobytes() + str(data.shape).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    try:
        c = codec.get_codec(spec)
        for step, key in ((0, "a"), (7, "layer.3")):
            frame = c.encode(x, step=step, key=key)
            put("frame", frame)
            put("decode", codec.decode(frame))
        ef = codec.ErrorFeedback(c)
        rng = np.random.default_rng(5)
        for _ in range(3):
            g = narrowed(x.astype(np.float64) * (1 + 0.25 * rng.standard_normal(x.shape)), x.dtype)
            put("ef", ef.encode(g, key="w"))
            put("residual", ef.residual("w"))
    except Exception as e:  # noqa: BLE001 - the class of a refusal is part of the behaviour
        put("error", type(e).__name__)
    return h.hexdigest()


def table() -> dict[str, list[str]]:
    xs = inputs()
    return {spec: [digest(spec, x) for x in xs] for spec in specs()}


def load() -> dict[str, list[str]]:
    return json.loads(HASHES.read_text())


@pytest.mark.parametrize("spec", sorted(load()) if HASHES.exists() else [])
def test_frames_byte_identical(spec):
    want = load()[spec]
    got = [digest(spec, x) for x in inputs()]
    variants = json.loads(BLAS_VARIANTS.read_text()).get(spec, [])
    if any(got == v["hashes"] for v in variants):
        return  # the frames another BLAS kernel set made from the same commit
    if got in changed(spec):
        return  # a documented format change (tests/fixtures/frame_changes.json, docs/format.md)
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    assert not bad, f"{spec}: frames, decodes or residuals changed for inputs {bad} (see tests/test_frames_unchanged.py)"


def test_blas_variants_only_for_blas_codecs():
    """Only PowerSGD (BLAS products) may have variants, and each differs from the main record."""
    main = load()
    for spec, variants in json.loads(BLAS_VARIANTS.read_text()).items():
        assert spec.startswith("powersgd") and spec in main, spec
        assert all(v["hashes"] != main[spec] and len(v["hashes"]) == len(main[spec]) for v in variants), spec


def test_every_codec_is_covered():
    missing = set(specs()) - set(load())
    assert not missing, f"codecs with no recorded hashes: {sorted(missing)}"


def test_documented_changes_name_their_documentation():
    """Every recorded change says why and points at docs/format.md's "Changes", which
    mentions it; it holds whole hash lists of known specs."""
    if not CHANGES.exists():
        return
    doc = (Path(__file__).parents[1] / "docs" / "format.md").read_text()
    main = load()
    for c in json.loads(CHANGES.read_text()):
        assert c["change"] and c["change"].split(":")[0] in doc, c["change"]
        assert all(spec in main and len(h) == len(main[spec]) for spec, h in c["specs"].items()), c["change"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--change"] and len(sys.argv) > 3:
        log = json.loads(CHANGES.read_text()) if CHANGES.exists() else []
        xs = inputs()
        log.append({"change": sys.argv[2], "specs": {spec: [digest(spec, x) for x in xs] for spec in sys.argv[3:]}})
        CHANGES.write_text(json.dumps(log, indent=1) + "\n")
        sys.exit(print(f"appended a change of {len(sys.argv) - 3} specs to {CHANGES}"))
    if sys.argv[1:] != ["--write"] or HASHES.exists():
        sys.exit("usage: python tests/test_frames_unchanged.py --write  (only when the file does not exist)")
    HASHES.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {HASHES}")
