"""Measuring a codec on named tensors: sizes, error sums in float64 and best-of-N timings
(``gradcodec roundtrip`` and ``gradcodec demo``)."""

from __future__ import annotations

from codec.cli.errors import DataError


class Stats:
    """Sizes, error sums and times of one or more tensors; ``row()`` gives the table/JSON row."""

    def __init__(self):
        self.tensors = 0
        self.elements = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.sse = 0.0  # sum (y - x)^2
        self.sxx = 0.0
        self.syy = 0.0
        self.sxy = 0.0
        self.max_abs = 0.0
        self.t_enc = 0.0
        self.t_dec = 0.0

    def add(self, other: "Stats") -> None:
        for k in ("tensors", "elements", "bytes_in", "bytes_out", "sse", "sxx", "syy", "sxy", "t_enc", "t_dec"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.max_abs = max(self.max_abs, other.max_abs) if other.max_abs == other.max_abs else other.max_abs

    def compare(self, x, y) -> None:
        """Add the error sums of decoded ``y`` against ``x`` (float64; positions where both
        are the same NaN or inf count as no error)."""
        import numpy as np

        xd = np.asarray(x, dtype=np.float64).reshape(-1)
        yd = np.asarray(y, dtype=np.float64).reshape(-1)
        with np.errstate(all="ignore"):
            same = (xd == yd) | (np.isnan(xd) & np.isnan(yd))
            d = np.where(same, 0.0, yd - xd)
            self.sse += float(np.dot(d, d))
            self.sxx += float(np.dot(xd, xd))
            self.syy += float(np.dot(yd, yd))
            self.sxy += float(np.dot(xd, yd))
            m = float(np.max(np.abs(d))) if d.size else 0.0
        self.max_abs = max(self.max_abs, m) if m == m else m  # (a NaN error stays NaN, as in add)

    def row(self, name: str) -> dict:
        import math

        if self.sxx > 0:
            rel = math.sqrt(self.sse / self.sxx) if self.sse == self.sse else math.nan
        else:
            rel = 0.0 if self.sse == 0 else math.inf if self.sse == self.sse else math.nan
        if self.sxx > 0 and self.syy > 0:
            cos = self.sxy / math.sqrt(self.sxx * self.syy)
        elif self.sxx == 0 and self.syy == 0:
            cos = 1.0
        else:
            cos = 0.0
        return {
            "name": name,
            "tensors": self.tensors,
            "elements": self.elements,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "ratio": self.bytes_in / self.bytes_out if self.bytes_out else math.nan,
            "rel_l2_error": rel,
            "cosine": cos,
            "max_abs_error": self.max_abs,
            "encode_gbps": self.bytes_in / self.t_enc / 1e9 if self.t_enc > 0 else math.nan,
            "decode_gbps": self.bytes_in / self.t_dec / 1e9 if self.t_dec > 0 else math.nan,
        }


def measure_all(c, tensors: dict, repeat: int, step=None) -> list:
    """Encode and decode every tensor with codec ``c``; returns one :class:`Stats` per tensor.

    A first pass encodes and decodes each tensor untimed (the warm-up: Numba compiles there)
    and measures sizes and errors in float64.  Then ``repeat`` timed rounds go over all
    tensors, keeping each tensor's best encode and decode time; taking the rounds across the
    whole set (not ``repeat`` calls in a row) keeps one burst of machine noise from spoiling
    every timing of one tensor.  The garbage collector is off while timing, as in timeit.
    ``step()`` is called after each tensor of the first pass (progress).  A tensor the codec
    refuses raises DataError naming it.
    """
    import gc
    import time

    import numpy as np

    import codec

    done = []
    for name, x in tensors.items():
        try:
            frame = c.encode(x)
            y = codec.decode(frame)
        except codec.CodecError as e:
            raise DataError(f"tensor {name!r:.200}: {e}") from None
        s = Stats()
        s.tensors, s.elements, s.bytes_in, s.bytes_out = 1, int(x.size), int(x.nbytes), len(frame)
        s.t_enc = s.t_dec = float("inf")
        if int(np.size(y)) != int(x.size):
            raise DataError(f"tensor {name!r:.200}: decoded {np.size(y)} elements, encoded {x.size}")
        s.compare(x, y)
        done.append((x, frame, s))
        if step is not None:
            step()
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for x, frame, s in done:
                t0 = time.perf_counter()
                c.encode(x)
                t1 = time.perf_counter()
                codec.decode(frame)
                t2 = time.perf_counter()
                s.t_enc, s.t_dec = min(s.t_enc, t1 - t0), min(s.t_dec, t2 - t1)
    finally:
        if gc_was_on:
            gc.enable()
    return [s for _, _, s in done]



def track(c, steps: list, *, feedback: bool) -> tuple[float, float]:
    """How well the sum of decoded steps tracks the true sum: ``steps`` (consecutive steps,
    each ``{name: gradient}``) encoded and decoded in order with codec ``c``, under
    :class:`codec.ErrorFeedback` when ``feedback`` (what a step drops is added to the next),
    else each step alone at its step number.  Returns ``(||sum y - sum x|| / ||sum x||,
    cosine(sum y, sum x))`` over every tensor, in float64.  A tensor the codec refuses raises
    DataError naming it and the step."""
    import numpy as np

    import codec

    ef = codec.ErrorFeedback(c) if feedback else None
    want: dict = {}
    got: dict = {}
    for i, step in enumerate(steps):
        for name, x in step.items():
            try:
                frame = ef.encode(x, key=name) if ef is not None else c.encode(x, key=name, step=i)
                y = codec.decode(frame)
            except codec.CodecError as e:
                raise DataError(f"tensor {name!r:.200} at step {i}: {e}") from None
            want[name] = want.get(name, 0.0) + np.asarray(x, np.float64).reshape(-1)
            got[name] = got.get(name, 0.0) + np.asarray(y, np.float64).reshape(-1)
    total = Stats()
    for k in want:
        total.compare(want[k], got[k])
    row = total.row("sum")
    return row["rel_l2_error"], row["cosine"]
