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

Memory: one ``codec.ErrorFeedback`` slot per tensor name (:class:`Memory`): the residual in
the accumulator dtype (float32, float64 for float64 tensors; none without error feedback),
the step, and with ``warm_start`` the summed Q as ``"powersgd.q"``, the field the codec's
PowerSGD stage keeps it in, so the stage's ``check_state`` checks a loaded one.  A tensor
whose shape or dtype changes starts over (a new slot; without error feedback its step goes
on).  ``prepare`` reads the slots (``ErrorFeedback.slot``), ``start`` stores them
(``ErrorFeedback.keep``), ``finish`` installs the new residual (``Slot.commit``), the new Q
and the next step.

Device tensors (``devices``): ``M``, the residual, ``Q_local = M^T P`` and ``P Q^T`` are
formed where the tensor lives (the ``lowrank`` twins; ``P Q^T`` by ``lowrank.expand``, the
fixed order the codec decodes with, on the host too, so both give the same bits); the
orthogonalisation is host code, so ``P`` comes down and ``P`` and ``Q`` go up: only the
rounds' messages cross, and a passed-through tensor (sent dense) comes down whole and its
sum goes up once.
"""

from __future__ import annotations

import time

import numpy as np

import codec
from codec.arrays import first_nonfinite, wide_dtype
from codec.device import Memory as _Memory, add, clear, host_copy
from codec.dtypes import on_device
from codec.errors import CodecValueError
from codec.lowrank.powersgd import STATE_Q, back_project, expand, matrix_of, orthogonalize, project, start_q  # STATE_Q: the stage's own field of the warm-start Q
from codec.modes import SUB
from codec.ops import store, widen
from transport.device import finish_on_device
from transport.schemes.base import Scheme, Sums, check_finite, finish_device, finish_sum

__all__ = ["Memory", "STATE_Q", "TwoRound"]



class Memory(codec.ErrorFeedback):
    """The two-round PowerSGD's per-tensor memory: an ``ErrorFeedback`` of the ``powersgd``
    codec whose step the scheme runs itself (``slot``/``keep``).  Its residuals are in the
    accumulator dtype, so a loaded slot must be float32 or float64 and, since every residual
    is added into the next step's input, finite (passed-through tensors included: the
    transport checks them too); everything else is ``ErrorFeedback``'s check."""

    def check_slot(self, slot, where):
        what = "residual" if slot.residual is not None else "dtype"
        if slot.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise CodecValueError(f"{where}: {what}: dtype {slot.dtype}; powersgd keeps float32 (float64 for float64 tensors)")
        if slot.residual is not None and self.codec.passes_nonfinite(slot.shape):  # else ErrorFeedback's check scanned it
            check_finite(slot.residual, f"{where}: residual", "two-round powersgd", "would send it in the next step")


class TwoRound(Scheme):
    """``powersgd(...)`` as the two-round allreduce; no value or bytes stage (P and Q travel
    as MPI Allreduce buffers in float32, float64 for float64 tensors).  Device tensors stay
    on the device (``M``, the residual, ``P Q^T`` into ``out``); P and Q are formed on the host,
    where the orthogonalisation runs, so they are what crosses."""

    devices = True

    def __init__(self, codec_or_spec, reducer):
        super().__init__(codec_or_spec, reducer)
        c = self.codec
        if len(codec.parse_spec(c.spec)) != 1:  # the canonical spec leaves out the implicit value stage
            raise CodecValueError(
                f"codec_or_spec: two-round PowerSGD allreduces P and Q as plain arrays; {c.spec!r} adds stages it cannot apply (use 'powersgd(...)')"
            )
        if reducer.vote:
            raise CodecValueError("vote: majority vote needs a sign codec, not powersgd")
        if reducer.bucket_bytes:
            raise CodecValueError("bucket_bytes: powersgd compresses each tensor as its own matrix; leave bucket_bytes at 0")
        self.stage = c.transform
        #: per tensor name: residual (without error feedback: none), step, warm-start Q
        self.ef = Memory(c, residuals=reducer.error_feedback)

    def prepare(self, arrays, keys):
        """Everything before round 1, on this rank alone: ``M = x + residual``, its check
        (finite), the starting Q and ``P = M Q`` (finite too: a finite M can overflow), so a
        rank whose input cannot go through fails in the config check, with every other
        rank, before anything is sent.  Nothing is stored.  A device tensor's ``M`` (and its
        residual) stay on the device: only ``P`` comes down (a passed-through tensor, sent
        dense, comes down whole)."""
        st = self.stage
        work, wire = [], []
        for a, name in zip(arrays, keys):
            dt = wide_dtype(a.dtype)
            dev = on_device(a)
            slot = self.ef.slot(name, a.shape, dt, device=dev)  # stored, or new and not stored yet
            slot.follow(dev)  # (a stored residual moves where the gradient is, once)
            acc = _summed(a, slot.residual, dt)  # a new buffer, where a lives
            plan = matrix_of(a.shape, st.rank, st.min_compression_rate)
            if plan is None:  # sent dense in round 1, from the host
                part = host_copy(acc) if dev else acc
                check_finite(part, f"tensors[{name!r}]", "powersgd")
                work.append((slot, acc, None, part))
                wire.append(part.nbytes)
                continue
            n, m, r = plan
            mat = acc.reshape(n, m)
            q = start_q(slot.state.get(STATE_Q), m, r, dt, st.seed, name, slot.step, st.warm_start)
            p, bad = project(mat, q)  # (NaN and inf in M counted in the product's pass)
            if bad:
                check_finite(host_copy(acc) if dev else acc, f"tensors[{name!r}]", "powersgd")
            if first_nonfinite(p) >= 0:  # a finite M can overflow
                big = float(np.abs(host_copy(mat) if dev else mat).max())
                check_finite(p, f"tensors[{name!r}]: P = M Q", "powersgd", f"cannot send it (M Q overflows {dt}; |M| up to {big:.3g})")
            work.append((slot, mat, plan, p))
            wire.append((n + m) * r * dt.itemsize)
        return arrays, keys, work, wire

    def start(self, prepared, stats):
        arrays, keys, work, wire = prepared
        for slot, *_rest in work:
            self.ef.keep(slot)
        rounds = Sums(self.reducer.comm, arrays).start([w[3] for w in work], stats)
        return _TwoRoundPending(self, arrays, work, rounds, wire)


class _TwoRoundPending:
    def __init__(self, scheme, arrays, work, rounds, wire):
        self.scheme, self.arrays, self.work, self.rounds = scheme, arrays, work, rounds
        self.wire = wire

    def test(self):
        return self.rounds.test()

    def finish(self, stats, out):
        red = self.scheme.reducer
        summed = self.rounds.wait()
        t = time.perf_counter()
        ps, qs = [], []
        for (slot, mat, plan, _), s in zip(self.work, summed):
            if plan is None:
                ps.append(None)
                qs.append(np.empty(0, s.dtype))
                continue
            n, m, r = plan
            p = _mem(mat).put(orthogonalize(s.reshape(n, r).copy()))  # (put on the device once, for the three products)
            q_local = back_project(mat, p)
            if slot.residual is not None:  # this rank's M - P Q_local^T, in M's own buffer
                y = _mem(mat).empty((n, m), mat.dtype)
                expand(p, q_local, y)
                store(y.reshape(y.size), mat.reshape(mat.size), SUB)  # M is not read again this step
                slot.commit(mat.reshape(slot.shape), keep_spare=False)
            ps.append(p)
            qs.append(q_local.reshape(-1))
        work_s = time.perf_counter() - t
        qsum = Sums(red.comm, self.arrays).start(qs, stats).wait()
        c1 = time.perf_counter()
        res = []
        warm = self.scheme.stage.warm_start
        for a, (slot, mat, plan, _), s, p, qq, o in zip(self.arrays, self.work, summed, ps, qsum, out):
            dev = on_device(a)
            if plan is None:  # a view of round 1's buffer, as with none (or the caller's array)
                res.append(finish_device(s, a, red, o) if dev else finish_sum(s, a.dtype, red.size, red.average, out=o).reshape(a.shape))
                if slot.residual is not None:  # sent whole: nothing left over
                    _cleared(slot)
            else:
                n, m, r = plan
                qm = qq.reshape(m, r).copy()
                into = o is not None and o.dtype == p.dtype  # P Q^T straight into the caller's array
                y = o if into else _mem(a).empty(a.size, p.dtype)
                expand(p, qm, y.reshape(n, m))
                if dev:
                    res.append(finish_on_device(y.reshape(a.shape), a.dtype, red.size, red.average, out=o))
                else:
                    res.append(finish_sum(y.reshape(a.shape), a.dtype, red.size, red.average, out=o).reshape(a.shape))
                if warm:  # the next step's start (without warm_start, Q is drawn afresh)
                    slot.state[STATE_Q] = qm
            slot.step += 1
        stats.decode_s = work_s + time.perf_counter() - c1
        return res


def _summed(a, residual, dt):
    """``M = a + residual`` in the accumulator dtype ``dt`` (``a`` widened exactly, the sum
    rounded once), a new buffer where ``a`` lives; ``a`` itself widened into a new buffer
    without a residual."""
    if not on_device(a):
        return a.astype(dt) if residual is None else np.add(a, residual, dtype=dt)
    x = widen(a)
    if residual is None and x is not a:
        return x
    acc = _mem(a).empty(a.shape, dt)
    if residual is None:
        acc.copy_to_device(a)
    else:
        add(x, residual, acc)
    return acc


def _mem(a):
    """Allocations where ``a`` lives (:class:`codec.device.Memory`)."""
    return _Memory(on_device(a))


def _cleared(slot) -> None:
    """A passed-through tensor's residual after a step: zero (it was sent whole)."""
    if on_device(slot.residual):
        clear(slot.residual)
    elif slot.residual.any():  # (zero after one step: not written again)
        slot.commit(np.zeros_like(slot.residual), keep_spare=False)
