"""Outcomes and findings: the per-call bounds, :class:`Finding`, :class:`Outcome`, the label of an
unexpected exception (where in gradcodec it came from), and :class:`_Calls`, which runs each
API call under the bounds and turns anything unexpected into a Finding.
"""

from __future__ import annotations

import time
import traceback
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from codec.errors import CodecError


#: per-call bounds (a finding when exceeded)
MEMORY_FLOOR = 64 << 20  #: tracemalloc peak allowed to any call
TIME_BOUND = 5.0  #: seconds any one call may take (inputs are small; generous for a shared machine)
#: the element cap the harness decodes with (codec.decode(max_elements=)): a receiver's way to
#: bound the dense output; decode_sparse runs without it (it allocates no dense output)
MAX_ELEMENTS = 1 << 20


class Finding(Exception):
    """An outcome outside the promise (raised by targets under atheris; returned by check)."""

    def __init__(self, label: str, detail: str = ""):
        super().__init__(f"{label}: {detail}" if detail else label)
        self.label = label
        self.detail = detail


#: its public name, as before the package split: tracebacks print ``codec.fuzzing.Finding``,
#: pickles find it there, and tests/test_errors.py lists it under that name
Finding.__module__ = "codec.fuzzing"


@dataclass
class Outcome:
    """``kind`` is ok, rejected (an expected error; ``label`` names it), invalid (the harness
    could not build the input) or finding (``label`` is the finding class, ``detail`` says more)."""

    kind: str
    label: str
    detail: str = ""

    @property
    def finding(self) -> bool:
        return self.kind == "finding"


#: the repository (codec/fuzzing/findings.py is three levels below it)
_ROOT = Path(__file__).resolve().parents[2]


def _site(tb) -> str:
    """``file:function`` of the innermost traceback frame in codec/ or transport/ (not the fuzzing
    harness: codec/fuzzing/)."""
    frames = traceback.extract_tb(tb)
    pick = None
    for fr in frames:
        p = Path(fr.filename)
        try:
            rel = p.resolve().relative_to(_ROOT)
        except ValueError:
            continue
        if rel.parts[0] in ("codec", "transport") and rel.parts[:2] != ("codec", "fuzzing"):
            pick = f"{rel.as_posix()}:{fr.name}"
    if pick is None and frames:
        fr = frames[-1]
        pick = f"{Path(fr.filename).name}:{fr.name}"
    return pick or "?"


def _recursing(tb) -> str:
    """The function that appears most often in a traceback (the one recursing), as
    ``file:function`` (the path relative to the repository for gradcodec's own files)."""
    counts: dict = {}
    for fr in traceback.extract_tb(tb):
        try:
            name = Path(fr.filename).resolve().relative_to(_ROOT).as_posix()
        except ValueError:
            name = Path(fr.filename).name
        k = f"{name}:{fr.name}"
        counts[k] = counts.get(k, 0) + 1
    return max(counts, key=counts.get) if counts else "?"


def _exc_label(call: str, e: BaseException) -> str:
    if isinstance(e, RecursionError):  # where the limit hits is arbitrary: name what recursed
        inner = _recursing(e.__traceback__)
        site = _site(e.__traceback__)
        e.args = (f"{e} (innermost gradcodec frame: {site})",)
        return f"RecursionError in {inner}"
    return f"{type(e).__name__} at {_site(e.__traceback__)}"


class _Calls:
    """Runs API calls under the memory and time bounds; raises Finding for anything else."""

    def __init__(self, track_memory: bool):
        self.track = track_memory and tracemalloc.is_tracing()

    def call(self, name, fn, *args, expect=(CodecError,), mem_bound=MEMORY_FLOOR, **kw):
        """``(result, None)``, or ``(None, exception)`` for an expected exception type."""
        if self.track:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        err = None
        try:
            res = fn(*args, **kw)
        except expect as e:
            res, err = None, e
        except Finding:
            raise
        except BaseException as e:  # noqa: BLE001 - the point is to catch anything else
            if isinstance(e, KeyboardInterrupt):
                raise
            raise Finding(_exc_label(name, e), f"in {name}: {e}"[:300]) from None
        dt = time.perf_counter() - t0
        if dt > TIME_BOUND:
            # the first call of a kernel in a process loads it from Numba's cache (or compiles
            # it): seconds, once (docs/robustness.md, "The first call").  Slow is slow twice.
            t1 = time.perf_counter()
            try:
                fn(*args, **kw)
            except BaseException as e:  # noqa: BLE001 - the first call's outcome stands; only the time is asked
                if isinstance(e, KeyboardInterrupt):
                    raise
            again = time.perf_counter() - t1
            if again > TIME_BOUND:
                raise Finding(f"{name}: slower than {TIME_BOUND:g} s", f"{dt:.2f} s, then {again:.2f} s again")
        if self.track:
            peak = tracemalloc.get_traced_memory()[1] - base
            if peak > mem_bound:
                raise Finding(f"{name}: allocated above the bound", f"peak {peak} bytes > {mem_bound}")
        return res, err
