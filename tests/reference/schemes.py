"""Independent serial references for two transport schemes (tests/test_transport_schemes.py,
tests/mpi_schemes.py): the gTop-k merge tree and the two-round PowerSGD, for ``p`` simulated
ranks in one process.

Nothing here imports ``transport``: the merge, the tree schedule, the error-feedback
bookkeeping and the averaging are written from the docstrings of transport/schemes/gtopk.py
and transport/schemes/powersgd.py.  The codec (``codec.ErrorFeedback``, ``codec.decode_sparse``,
``codec.arrays.round_to``, ``codec.lowrank.powersgd``'s ``matrix_of``/``start_q``/
``orthogonalize``) is used as the building block the transport is specified against.
Importable as ``reference.schemes`` from tests/.

Inputs: every rank's tensors are drawn from ``(seed, rank, step)`` (plus a component shared
by all ranks, drawn from ``(seed, step)``, so the ranks' top-k positions overlap), so any
rank can rebuild every other rank's inputs and run the whole simulation locally.
"""

from __future__ import annotations

import numpy as np

import codec
from codec.arrays import round_to
from codec.lowrank.powersgd import matrix_of, orthogonalize, start_q

from .lowrank import back_project, project  # (the fixed-order products, in NumPy)
from .transport import BF16, F16, F64, acc_dtype, finish


# ====================================================================== inputs
def make_tensor(seed: int, rank: int, step: int, name: str, shape, dtype, kind: str = "randn") -> np.ndarray:
    """One rank's tensor ``name`` at ``step``.

    kinds: ``randn`` (independent per rank), ``shared`` (a common N(0, 4) component for all
    ranks plus per-rank N(0, 1) noise: top-k positions overlap across ranks, so merges sum
    equal positions), ``ties`` (multiples of 0.5 in [-1.5, 1.5]: equal magnitudes everywhere,
    equal sums in the merges), ``lowrank`` (the same rank-1 matrix on every rank)."""
    n = int(np.prod(shape, dtype=np.int64))
    tag = sum(map(ord, name)) * 1000 + len(name)
    rng = np.random.default_rng([seed, tag, rank, step])
    if kind == "randn":
        x = rng.standard_normal(n)
    elif kind == "shared":
        common = np.random.default_rng([seed, tag, 10**6, step]).standard_normal(n)
        x = 2.0 * common + rng.standard_normal(n)
    elif kind == "ties":
        x = rng.integers(-3, 4, n) * 0.5
    elif kind == "lowrank":
        g = np.random.default_rng([seed, tag, 10**6])
        u = g.standard_normal(shape[0])
        v = g.standard_normal(n // shape[0] if shape[0] else 0)
        x = np.outer(u, v).reshape(-1)
    else:
        raise ValueError(kind)
    x = x.reshape(shape)
    dtype = np.dtype(dtype)
    if dtype in (F16, BF16):
        return round_to(x.astype(F64), dtype)
    return x.astype(dtype)


def make_inputs(seed: int, rank: int, step: int, layout) -> dict:
    """``{name: tensor}`` for ``layout`` = [(name, shape, dtype, kind), ...]."""
    return {name: make_tensor(seed, rank, step, name, shape, dt, kind) for name, shape, dt, kind in layout}


# ====================================================================== gTop-k
def merge_pairs(a: dict, b: dict, k: int) -> dict:
    """Union of two ``{position: value}`` maps, values added where a position is in both,
    then the ``k`` entries of largest |value| (ties: lower position first), as a dict whose
    iteration order is by position."""
    union = dict(a)
    for pos, val in b.items():
        union[pos] = union[pos] + val if pos in union else val
    ranked = sorted(union.items(), key=lambda kv: (-abs(float(kv[1])), kv[0]))
    return dict(sorted(ranked[:k]))


def tree_plan(p: int):
    """``(p2, extras, rounds)``: p2 = largest power of two <= p, extras = ranks p2..p-1 (rank
    e folds into e - p2), rounds = the exchange distances 1, 2, 4, ... < p2."""
    p2 = 1
    while p2 * 2 <= p:
        p2 *= 2
    rounds = []
    d = 1
    while d < p2:
        rounds.append(d)
        d *= 2
    return p2, list(range(p2, p)), rounds


def tree_sends(rank: int, p: int) -> int:
    """How many times ``rank`` sends its pair set in one step of the tree."""
    if p == 1:
        return 0
    p2, extras, rounds = tree_plan(p)
    if rank >= p2:
        return 1  # hands its pairs to rank - p2
    return len(rounds) + (1 if rank + p2 < p else 0)  # exchanges, plus the final return


def gtopk_tree(local: list, k: int) -> list:
    """Run the fold / recursive-doubling / unfold tree over every rank's pair map; returns the
    final map each rank holds."""
    p = len(local)
    sets = [dict(s) for s in local]
    if p == 1:
        return sets
    p2, extras, rounds = tree_plan(p)
    for e in extras:
        sets[e - p2] = merge_pairs(sets[e - p2], sets[e], k)
    for d in rounds:
        sets[:p2] = [merge_pairs(sets[q], sets[q ^ d], k) for q in range(p2)]
    for e in extras:
        sets[e] = sets[e - p2]
    return sets


class GTopKSim:
    """``p`` ranks running ``Allreducer("gtopk(...)...", average=, error_feedback=,
    rank_streams=)``: ``local_spec`` is the per-rank codec (``topk(...)`` plus value stages)."""

    def __init__(self, local_spec: str, p: int, *, average: bool = True, error_feedback: bool = True, rank_streams: bool = True):
        self.codec = codec.get_codec(local_spec, checksum=False)  # as the Allreducer builds it
        self.p, self.average, self.rank_streams = p, average, rank_streams
        self.efs = [codec.ErrorFeedback(self.codec) for _ in range(p)] if error_feedback else None
        self.calls = 0
        #: (rank, key) -> frames made under that key without error feedback (the key's step)
        self.steps: dict = {}
        self.ks: dict = {}

    def key(self, name, rank):
        return (name, rank) if self.rank_streams else name

    def step(self, inputs: list) -> dict:
        """``inputs[r]`` = rank r's ``{name: tensor}``; returns ``{name: result}`` (the same
        on every rank, which the simulation asserts)."""
        out = {}
        for name in inputs[0]:
            arrays = [inputs[r][name] for r in range(self.p)]
            dt = arrays[0].dtype
            vdt = acc_dtype(dt)
            local = []
            for r, x in enumerate(arrays):
                if self.efs is not None:
                    frame = self.efs[r].encode(x, self.key(name, r))
                else:
                    step = self.steps.get((r, self.key(name, r)), 0)
                    frame = self.codec.encode(x, key=self.key(name, r), step=step)
                    self.steps[(r, self.key(name, r))] = step + 1
                pos, val = codec.decode_sparse(frame)
                local.append({int(q): vdt.type(v) for q, v in zip(pos.tolist(), val.astype(vdt))})
            k = len(local[0])
            assert all(len(s) == k for s in local), "ranks selected different counts"
            self.ks[name] = k
            final = gtopk_tree(local, k)
            assert all(list(f.items()) == list(final[0].items()) for f in final), "tree did not converge"
            acc = np.zeros(x.size, vdt)
            if final[0]:
                acc[np.array(list(final[0]), np.int64)] = np.array(list(final[0].values()), vdt)
            out[name] = finish(acc, dt, self.p, self.average).reshape(x.shape)
            if self.efs is not None:
                for r, pairs in enumerate(local):
                    missed = [q for q in pairs if q not in final[0]]
                    if missed:
                        self.efs[r].add_residual(
                            self.key(name, r), np.array([pairs[q] for q in missed], vdt), np.array(missed, np.int64)
                        )
        self.calls += 1
        return out

    def residual(self, name, rank) -> np.ndarray:
        return np.array(self.efs[rank].residual(self.key(name, rank)))


# ====================================================================== two-round PowerSGD
class PowerSGDSim:
    """``p`` ranks running ``Allreducer("powersgd(rank=, warm_start=, min_compression_rate=,
    seed=)", average=, error_feedback=)``."""

    def __init__(self, p: int, *, rank: int = 2, warm_start: bool = True, min_compression_rate: float = 2.0, seed: int = 0,
                 average: bool = True, error_feedback: bool = True):
        self.p, self.rank, self.warm, self.rate, self.seed = p, rank, warm_start, min_compression_rate, seed
        self.average, self.ef = average, error_feedback
        #: name -> {"res": [per-rank residual] or None, "q": last summed Q, "step": int}
        self.mem: dict = {}

    def step(self, inputs: list) -> dict:
        out = {}
        for name in inputs[0]:
            xs = [inputs[r][name] for r in range(self.p)]
            shape, dt = xs[0].shape, xs[0].dtype
            adt = acc_dtype(dt)
            mem = self.mem.get(name)
            if mem is None or (mem["res"] is not None and (mem["res"][0].shape != shape or mem["res"][0].dtype != adt)):
                mem = {"res": [np.zeros(shape, adt) for _ in range(self.p)] if self.ef else None, "q": None, "step": 0}
                self.mem[name] = mem
            accs = [x.astype(adt) + mem["res"][r] if self.ef else x.astype(adt) for r, x in enumerate(xs)]
            plan = matrix_of(shape, self.rank, self.rate)
            if plan is None:
                s = accs[0].copy()
                for a in accs[1:]:
                    s = s + a
                out[name] = finish(s, dt, self.p, self.average).reshape(shape)
                if self.ef:
                    mem["res"] = [np.zeros(shape, adt) for _ in range(self.p)]
            else:
                n, m, r = plan
                mats = [a.reshape(n, m) for a in accs]
                q = start_q(mem["q"], m, r, adt, self.seed, name, mem["step"], self.warm)
                psum = project(mats[0], q)
                for mat in mats[1:]:
                    psum = psum + project(mat, q)
                pm = orthogonalize(psum.copy())
                qs = [back_project(mat, pm) for mat in mats]
                if self.ef:
                    mem["res"] = [(mat - pm @ qi.T).reshape(shape) for mat, qi in zip(mats, qs)]
                qsum = qs[0]
                for qi in qs[1:]:
                    qsum = qsum + qi
                out[name] = finish(pm @ qsum.T, dt, self.p, self.average).reshape(shape)
                mem["q"] = qsum
            mem["step"] += 1
        return out

    def residual(self, name, rank) -> np.ndarray:
        return self.mem[name]["res"][rank]
