"""The alpha-beta cost model of one allreduce step (docs/transport.md, "Cost model").

A message of ``s`` bytes between two ranks costs ``alpha + s * beta``: ``alpha`` the latency,
``beta = 8 / bandwidth`` seconds per byte.  Assumptions: every rank has one full-duplex link
of that bandwidth into a non-blocking switch (it can send and receive ``s`` bytes at once in
one ``alpha + s * beta``), no contention, no overlap with computation, and the classic
algorithms an MPI picks for large messages:

=====================  =========================================================================
scheme                 time of one step, p ranks
=====================  =========================================================================
ring allreduce         ``2 (p-1) alpha + 2 (p-1)/p * D * beta``, D = dense bytes (``none``)
ring allgather         ``(p-1) alpha + (p-1) * s * beta``, s = one rank's message (any codec)
gTop-k tree            ``R (alpha + 8 k beta)``, R = log2(P2) rounds, + 2 when p is not a power
                       of two (fold and unfold); 8 bytes per pair (uint32 position, float32 value)
two-round PowerSGD     two ring allreduces, of the P (n r) and the Q (m r) floats, 4 bytes each
=====================  =========================================================================

Computation is added separately, from times measured on this machine (``compute_s``): the
encode of one rank's message, plus, for the allgather, decoding ``p`` messages (it grows with
``p``: every rank decodes every rank's frames), for gTop-k ``R`` merges of ``k`` pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from codec.errors import CodecValueError

#: link presets: (name, bits per second, latency alpha in seconds)
LINKS = (
    ("1 Gbit/s", 1e9, 50e-6),
    ("10 Gbit/s", 10e9, 20e-6),
    ("100 Gbit/s", 100e9, 3e-6),
)
#: rank counts of the projection table
RANKS = (8, 32, 128, 1024)


@dataclass(frozen=True)
class Link:
    """``alpha`` seconds of latency per message, ``bandwidth`` bits per second."""

    alpha: float
    bandwidth: float

    @property
    def beta(self) -> float:
        return 8.0 / self.bandwidth


def ring_allreduce(p: int, nbytes: float, link: Link) -> float:
    """Dense ring allreduce of ``nbytes`` per rank (reduce-scatter then allgather)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * nbytes * link.beta


def ring_allgather(p: int, nbytes: float, link: Link) -> float:
    """Ring allgather of ``nbytes`` contributed by each rank (every rank receives ``(p-1) nbytes``)."""
    if p <= 1:
        return 0.0
    return (p - 1) * (link.alpha + nbytes * link.beta)


def tree_rounds(p: int) -> int:
    """Rounds of the gTop-k tree: log2 of the largest power of two <= p, plus fold and unfold."""
    if p <= 1:
        return 0
    p2 = 1 << (p.bit_length() - 1)
    return int(math.log2(p2)) + (2 if p2 != p else 0)


def gtopk(p: int, k: int, link: Link, pair_bytes: int = 8) -> float:
    """The gTop-k tree: every round moves ``k`` pairs each way."""
    return tree_rounds(p) * (link.alpha + k * pair_bytes * link.beta)


def powersgd(p: int, p_bytes: float, q_bytes: float, link: Link) -> float:
    """Two ring allreduces: of P (``p_bytes``) and of Q (``q_bytes``)."""
    return ring_allreduce(p, p_bytes, link) + ring_allreduce(p, q_bytes, link)


@dataclass(frozen=True)
class Scheme:
    """One codec's step, described by what it moves and what it computes.

    ``kind``: ``"allreduce"`` (``none``; ``nbytes`` dense), ``"allgather"`` (``nbytes`` one
    rank's message), ``"gtopk"`` (``k`` pairs in total over the tensors) or ``"powersgd"``
    (``nbytes`` = P bytes, ``q_bytes`` = Q bytes).  ``encode_s``, ``decode_s`` (one frame, or
    one merge for gTop-k): measured compute seconds."""

    name: str
    kind: str
    nbytes: float
    k: int = 0
    q_bytes: float = 0.0
    encode_s: float = 0.0
    decode_s: float = 0.0

    def comm_s(self, p: int, link: Link) -> float:
        if self.kind == "allreduce":
            return ring_allreduce(p, self.nbytes, link)
        if self.kind == "allgather":
            return ring_allgather(p, self.nbytes, link)
        if self.kind == "gtopk":
            return gtopk(p, self.k, link)
        if self.kind == "powersgd":
            return powersgd(p, self.nbytes, self.q_bytes, link)
        raise CodecValueError(f"kind: unknown scheme kind {self.kind!r}")

    def compute_s(self, p: int) -> float:
        if self.kind == "allgather":
            return self.encode_s + p * self.decode_s
        if self.kind == "gtopk":
            return self.encode_s + tree_rounds(p) * self.decode_s
        return self.encode_s + self.decode_s

    def step_s(self, p: int, link: Link) -> float:
        return self.comm_s(p, link) + self.compute_s(p)


def projection(schemes, links=LINKS, ranks=RANKS):
    """Rows ``(link name, p, {scheme name: seconds per step})`` for every link and rank count."""
    rows = []
    for name, bw, alpha in links:
        link = Link(alpha, bw)
        for p in ranks:
            rows.append((name, p, {s.name: s.step_s(p, link) for s in schemes}))
    return rows
