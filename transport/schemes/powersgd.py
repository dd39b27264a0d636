"""Two-round PowerSGD over MPI (Vogels et al., NeurIPS'19, Algorithms 1 and 2), with the
codec's functions (``codec.lowrank.powersgd``: ``matrix_of``, ``start_q``, ``orthogonalize``)
and its parameters (``powersgd(rank=2, warm_start=true, min_compression_rate=2, seed=0)``).

Per step, every rank, for every tensor of the step at once:

    M = x + residual                       (the tensor as an n x m matrix, float32 or float64);
                                           M and P = M Q must be finite, checked before the
                                           step's first collective (the config check)
    Q = start_q(last Q, ...)               warm start, or the draw of (seed, name, step):
                                           the same on every rank
    round 1   Allreduce SUM of every P = M Q (and of the tensors that pass through, dense)
    P = orthogonalize(sum of P)            identical on every rank
    Q_local = M^T P;  residual = M - P Q_local^T
    round 2   Allreduce SUM of every Q_local
    result = P Q^T  (/ p when averaging);  the summed Q is the next step's warm start

The residual is each rank's own ``M - P Q_local^T`` (the paper's ``e_w = Delta_w -
decompress(C(Delta_w))``), so the ranks' decoded parts add up to the result exactly as with
the allgather scheme; PyTorch's hook instead keeps ``M - result``.  Tensors that pass through
(``ndim <= 1`` or too small to pay, as in the codec) are summed densely in round 1 and leave
no residual.  One Allreduce per accumulator dtype per round.
"""

from __future__ import annotations

import copy
import time

import numpy as np

import codec
from codec.arrays import owned_float_array, wide_dtype
from codec.lowrank.powersgd import matrix_of, orthogonalize, start_q
from transport.schemes.base import Scheme, Sums, check_finite, finish_sum

__all__ = ["TwoRound"]


class TwoRound(Scheme):
    """``powersgd(...)`` as the two-round allreduce; no value or bytes stage (P and Q travel
    as MPI Allreduce buffers in float32, float64 for float64 tensors)."""

    def __init__(self, codec_or_spec, reducer):
        super().__init__(codec_or_spec, reducer)
        c = self.codec
        if len(codec.parse_spec(c.spec)) != 1:  # the canonical spec leaves out the implicit value stage
            raise ValueError(
                f"codec_or_spec: two-round PowerSGD allreduces P and Q as plain arrays; {c.spec!r} adds stages it cannot apply (use 'powersgd(...)')"
            )
        if reducer.vote:
            raise ValueError("vote: majority vote needs a sign codec, not powersgd")
        if reducer.bucket_bytes:
            raise ValueError("bucket_bytes: powersgd compresses each tensor as its own matrix; leave bucket_bytes at 0")
        self.stage = c.transform
        #: per tensor name: residual (None without error feedback), last summed Q, step
        self.memory: dict = {}

    def _slot(self, name, a, dt):
        """The tensor's memory, or a fresh one when it has none that fits (not stored yet:
        ``prepare`` changes no state)."""
        mem = self.memory.get(name)
        if mem is None or mem["residual"] is not None and (mem["residual"].shape != a.shape or mem["residual"].dtype != dt):
            mem = {"residual": np.zeros(a.shape, dt) if self.reducer.error_feedback else None, "q": None, "step": 0}
        return mem

    def prepare(self, arrays, keys):
        """Everything before round 1, on this rank alone: ``M = x + residual``, its check
        (finite), the starting Q and ``P = M Q`` (finite too: a finite M can overflow), so a
        rank whose input cannot go through fails in the config check, with every other
        rank, before anything is sent.  Nothing is stored."""
        st = self.stage
        work, wire = [], []
        for a, name in zip(arrays, keys):
            dt = wide_dtype(a.dtype)
            mem = self._slot(name, a, dt)
            acc = a.astype(dt) if mem["residual"] is None else np.add(a, mem["residual"], dtype=dt)  # a new buffer
            check_finite(acc, name, "powersgd")
            plan = matrix_of(a.shape, st.rank, st.min_compression_rate)
            if plan is None:
                work.append((mem, acc, None, acc))
                wire.append(acc.nbytes)
                continue
            n, m, r = plan
            mat = acc.reshape(n, m)
            q = start_q(mem["q"], m, r, dt, st.seed, name, mem["step"], st.warm_start)
            p = mat @ q
            if (p.size and not np.isfinite(p).all()):
                raise ValueError(f"tensors[{name!r}]: M Q overflows {dt} (|M| up to {float(np.abs(mat).max()):.3g}); powersgd cannot send it")
            work.append((mem, mat, plan, p))
            wire.append((n + m) * r * dt.itemsize)
        return arrays, keys, work, wire

    def start(self, prepared, stats):
        arrays, keys, work, wire = prepared
        for name, (mem, *_rest) in zip(keys, work):
            self.memory[name] = mem
        rounds = Sums(self.reducer.comm, arrays).start([w[3] for w in work], stats)
        return _TwoRoundPending(self, arrays, work, rounds, wire)

    def state_dict(self):
        return {"memory": copy.deepcopy(self.memory)}

    def load_state_dict(self, state):
        """Checks every tensor's memory (residual and Q: finite float32/float64 arrays, copied
        into fresh C-contiguous ones; step in range) before replacing any; a residual or Q
        that does not fit the tensor at the next step is redrawn, as :meth:`_slot` and
        ``start_q`` do for a fresh one."""
        if not isinstance(state, dict) or set(state) != {"memory"} or not isinstance(state["memory"], dict):
            raise ValueError(f"state: state: expected {{'memory': {{name: ...}}}}, got {state!r:.80}")
        memory = {}
        for name, mem in state["memory"].items():
            where = f"state: state: memory[{name!r}]"
            if not isinstance(mem, dict) or set(mem) != {"residual", "q", "step"}:
                raise ValueError(f"{where}: expected a dict with 'residual', 'q' and 'step'")
            clean = {"step": codec.check_step(mem["step"], f"{where}: step")}
            for field in ("residual", "q"):
                v = mem[field]
                if v is None:
                    clean[field] = None
                    continue
                arr = owned_float_array(v, f"{where}: {field}")
                if arr.dtype not in (np.float32, np.float64):
                    raise ValueError(f"{where}: {field}: dtype {arr.dtype}; powersgd keeps float32 (float64 for float64 tensors)")
                if not np.isfinite(arr).all():
                    raise ValueError(f"{where}: {field}: holds NaN or inf; powersgd's next step would send it")
                clean[field] = arr
            if (clean["residual"] is None) == self.reducer.error_feedback:
                raise ValueError(f"{where}: residual: {'missing' if clean['residual'] is None else 'present'}, but this Allreducer runs {'with' if self.reducer.error_feedback else 'without'} error feedback")
            if clean["q"] is not None and clean["q"].ndim != 2:
                raise ValueError(f"{where}: q: expected an m x r matrix, got shape {clean['q'].shape}")
            memory[name] = clean
        self.memory = memory


class _TwoRoundPending:
    def __init__(self, scheme, arrays, work, rounds, wire):
        self.scheme, self.arrays, self.work, self.rounds = scheme, arrays, work, rounds
        self.wire = wire

    def test(self):
        return self.rounds.test()

    def finish(self, stats):
        red = self.scheme.reducer
        summed = self.rounds.wait()
        t = time.perf_counter()
        ps, qs = [], []
        for (mem, mat, plan, _), s in zip(self.work, summed):
            if plan is None:
                ps.append(None)
                qs.append(np.empty(0, s.dtype))
                continue
            n, m, r = plan
            p = orthogonalize(s.reshape(n, r).copy())
            q_local = mat.T @ p
            if mem["residual"] is not None:
                np.subtract(mat, p @ q_local.T, out=mem["residual"].reshape(n, m))
            ps.append(p)
            qs.append(q_local.reshape(-1))
        work_s = time.perf_counter() - t
        qsum = Sums(red.comm, self.arrays).start(qs, stats).wait()
        c1 = time.perf_counter()
        out = []
        for a, (mem, mat, plan, _), s, p, qq in zip(self.arrays, self.work, summed, ps, qsum):
            if plan is None:  # a view of round 1's buffer, as with none
                out.append(finish_sum(s, a.dtype, red.size, red.average).reshape(a.shape))
                if mem["residual"] is not None:
                    mem["residual"][...] = 0
            else:
                n, m, r = plan
                qm = qq.reshape(m, r).copy()
                out.append(finish_sum(p @ qm.T, a.dtype, red.size, red.average).reshape(a.shape))
                mem["q"] = qm
            mem["step"] += 1
        stats.decode_s = work_s + time.perf_counter() - c1
        return out
