"""MPI checks of the gTop-k and two-round PowerSGD schemes against tests/reference/schemes.py.

Run under MPI (tests/test_transport_schemes.py launches it):

    mpiexec -n 4 python -m mpi4py tests/mpi_schemes.py gtopk powersgd

Every case runs on ``comm`` through the one MPI harness (tests/support/mpi.py: COMM_WORLD
here; the pytest process calls the same functions with COMM_SELF for p = 1).  Each rank
rebuilds every rank's inputs from (seed, rank, step), runs the serial simulation of all p ranks
and compares its own result and residuals with it.

Imports: tests/ is on sys.path (for ``reference`` and ``support``) and the launcher puts the
repository root on PYTHONPATH, as tests/support/mpi.py says.
"""

from __future__ import annotations

import sys

import numpy as np

from reference import schemes as ref
from reference.transport import BF16, F16, F32, F64
from support.mpi import Checks, main, run_case as harness_run_case
from transport import Allreducer

EPS = {F16: 2.0**-10, BF16: 2.0**-7, F32: 2.0**-23, F64: 2.0**-52}


class SchemeChecks(Checks):
    def match(self, got, want, what, exact, rtol=1e-5) -> bool:
        """Bitwise when ``exact``, else within ``rtol`` of the largest magnitude."""
        if exact:
            return self.same(got, want, what)
        want = np.asarray(want)
        return self.close(got, want, what, max(rtol, 4 * EPS[want.dtype]))


def _inputs(seed, step, layout, p):
    return [ref.make_inputs(seed, r, step, layout) for r in range(p)]


def saved_slot(red, key) -> dict:
    """The slot of ``key`` in the reducer's checkpoint (``state_dict()["feedback"]``, one
    ErrorFeedback state for every scheme)."""
    for slot in red.state_dict()["feedback"]["slots"]:
        if slot["key"] == key:
            return slot
    raise KeyError(key)


def _gtopk_residual(red, name, rank, rank_streams=True):
    return saved_slot(red, (name, rank) if rank_streams else name)["residual"]


# ====================================================================== gTop-k
GT_LAYOUT = [
    ("w", (40, 25), F32, "shared"),
    ("t", (120,), F32, "ties"),
    ("b", (7,), F32, "randn"),  # k = 1 for every ratio below 1/7
    ("e", (0,), F32, "randn"),  # empty
    ("z", (0, 5), F64, "randn"),  # empty, 2-D
    ("s", (), F32, "randn"),  # a scalar: k = 1 of 1
    ("h", (300,), F16, "shared"),
    ("bf", (10, 20), BF16, "ties"),
    ("d", (150,), F64, "shared"),
]


def _gtopk_run(ck, comm, spec, local_spec, *, steps=4, seed=11, layout=GT_LAYOUT, use_ireduce=False, **opts):
    p, rank = ck.size, ck.rank
    red = Allreducer(spec, comm, **opts)
    sim = ref.GTopKSim(local_spec, p, average=opts.get("average", True), error_feedback=opts.get("error_feedback", True),
                       rank_streams=opts.get("rank_streams", True))
    for step in range(steps):
        xs = _inputs(seed, step, layout, p)
        want = sim.step(xs)
        if use_ireduce:
            h = red.ireduce(xs[rank])
            got = h.wait()
            ck.true(h.wait() is got, f"{spec} step {step}: a second wait() did not return the kept result")
        else:
            got = red.reduce(xs[rank])
        tag = f"{spec} {opts} step {step}"
        ck.true(isinstance(got, dict) and list(got) == list(want), f"{tag}: result keys {list(got)}")
        for name in want:
            ck.same(got[name], want[name], f"{tag} result[{name!r}]")
            if sim.efs is not None and xs[0][name].size:
                ck.same(_gtopk_residual(red, name, rank, opts.get("rank_streams", True)), sim.residual(name, rank),
                        f"{tag} residual[{name!r}] of rank {rank}")
        ck.agree(got, tag)
        # bytes on the wire: an 8-byte status and one pair set (uint32 positions,
        # accumulator-dtype values) per send
        per_set = 8 + sum(k * (4 + ref.acc_dtype(xs[0][n].dtype).itemsize) for n, k in sim.ks.items())
        ck.true(red.stats.bytes_sent == ref.tree_sends(rank, p) * per_set,
                f"{tag}: bytes_sent {red.stats.bytes_sent}, want {ref.tree_sends(rank, p)} sends x {per_set}")
    return red, sim


def case_gtopk(comm, ck):
    """Ratio with EF and averaging over mixed dtypes, ties, k=1 and an empty tensor."""
    _gtopk_run(ck, comm, "gtopk(ratio=0.05)", "topk(ratio=0.05)", steps=4)


def case_gtopk_options(comm, ck):
    """k=3 without averaging; error_feedback=False with shared streams; a value stage; ireduce."""
    _gtopk_run(ck, comm, "gtopk(k=3)", "topk(k=3)", steps=3, average=False)
    _gtopk_run(ck, comm, "gtopk(ratio=0.05)", "topk(ratio=0.05)", steps=3, error_feedback=False, rank_streams=False)
    _gtopk_run(ck, comm, "gtopk(ratio=0.1)", "topk(ratio=0.1)", steps=3, rank_streams=False, use_ireduce=True)
    big = [("w", (1000,), F32, "shared"), ("h", (40, 30), F16, "randn"), ("bf", (500,), BF16, "shared"),
           ("d", (20, 20), F64, "ties"), ("b", (30,), F32, "randn")]
    _gtopk_run(ck, comm, "gtopk(ratio=0.01)+fp16", "topk(ratio=0.01)+fp16", steps=3, layout=big)
    _gtopk_run(ck, comm, "gtopk(k=2)+fp16+zstd", "topk(k=2)+fp16+zstd", steps=2, layout=big[1:3])


def case_gtopk_bytes(comm, ck):
    """One float32 tensor of 1000 elements, ratio 0.01 (k = 10): every rank of a power-of-two
    job sends log2(p) rounds of an 8-byte status and k * (4 + 4) bytes."""
    p, rank = ck.size, ck.rank
    red = Allreducer("gtopk(ratio=0.01)", comm)
    x = ref.make_tensor(5, rank, 0, "g", (1000,), F32, "randn")
    red.reduce({"g": x})
    if p & (p - 1) == 0:
        rounds = p.bit_length() - 1
        ck.true(red.stats.bytes_sent == rounds * (8 + 10 * 8), f"p={p}: bytes_sent {red.stats.bytes_sent}, want {rounds} * (8 + 10 * 8)")
    wire = red.stats.tensors["g"]["wire_bytes"]
    ck.true(wire > 0, f"wire_bytes {wire}")


def case_gtopk_state(comm, ck):
    """state_dict after 2 steps, loaded into a fresh Allreducer, continues identically."""
    p, rank = ck.size, ck.rank
    layout = GT_LAYOUT
    a = Allreducer("gtopk(ratio=0.05)", comm)
    for step in range(2):
        a.reduce(_inputs(21, step, layout, p)[rank])
    state = a.state_dict()
    b = Allreducer("gtopk(ratio=0.05)", comm)
    b.load_state_dict(state)
    for step in range(2, 4):
        xs = _inputs(21, step, layout, p)[rank]
        ga, gb = a.reduce(xs), b.reduce(xs)
        for name in ga:
            ck.same(gb[name], ga[name], f"gtopk after load_state_dict, step {step}, [{name!r}]")


# ====================================================================== PowerSGD
PS_LAYOUT = [
    ("w", (32, 24), F32, "randn"),
    ("c", (8, 3, 3, 4), F32, "shared"),  # n=8, m=36: compressed
    ("b", (16,), F32, "randn"),  # ndim 1: passes through
    ("s", (4, 4), F32, "randn"),  # too small to pay: passes through
    ("s0", (), F32, "randn"),  # a scalar passes through
    ("z", (3, 0), F32, "randn"),  # empty: passes through
    ("h", (24, 20), F16, "shared"),
    ("bf", (20, 30), BF16, "randn"),
    ("d", (30, 20), F64, "shared"),
]


def _spec(rank=2, warm=True, rate=2.0, seed=0):
    return f"powersgd(rank={rank}, warm_start={'true' if warm else 'false'}, min_compression_rate={rate:g}, seed={seed})"


def _psgd_residual(red, name):
    return saved_slot(red, name)["residual"]


def _psgd_run(ck, comm, *, steps=4, seed=31, layout=PS_LAYOUT, rank=2, warm=True, rate=2.0, pseed=0, **opts):
    """Result and residuals against the simulation (bitwise for p <= 2), identical on every
    rank, and the error-feedback invariant: sum_i (acc_i - residual_i) == result * p."""
    p, me = ck.size, ck.rank
    exact = p <= 2
    spec = _spec(rank, warm, rate, pseed)
    red = Allreducer(spec, comm, **opts)
    average, ef = opts.get("average", True), opts.get("error_feedback", True)
    sim = ref.PowerSGDSim(p, rank=rank, warm_start=warm, min_compression_rate=rate, seed=pseed, average=average, error_feedback=ef)
    for step in range(steps):
        xs = _inputs(seed, step, layout, p)
        before = {n: np.array(_psgd_residual(red, n)) for n in xs[me]} if ef and step else None
        want = sim.step(xs)
        got = red.reduce(xs[me])
        tag = f"{spec} {opts} step {step}"
        ck.agree(got, tag)
        for name, x in xs[me].items():
            ck.match(got[name], want[name], f"{tag} result[{name!r}]", exact, rtol=1e-5 if x.dtype != F16 and x.dtype != BF16 else 0)
            plan = ref.matrix_of(x.shape, rank, rate)
            if plan is not None and warm:
                ck.match(saved_slot(red, name)["state"]["powersgd.q"], sim.mem[name]["q"], f"{tag} warm Q[{name!r}]", exact)
            if not ef:
                continue
            res = _psgd_residual(red, name)
            ck.match(res, sim.residual(name, me), f"{tag} residual[{name!r}] of rank {me}", exact,
                     rtol=1e-5 if plan is None else 1e-4)
            # error feedback: what the ranks' residuals miss is exactly what the result holds
            adt = ref.acc_dtype(x.dtype)
            acc = x.astype(adt) + (before[name] if before is not None else 0)
            sent = (acc.astype(F64) - np.asarray(res, F64))
            total = np.empty_like(sent)
            comm.Allreduce(sent, total)
            full = want[name].astype(F64) * (p if average else 1)
            if x.dtype in (F16, BF16):
                tol = 2 * EPS[x.dtype] * p
            else:
                tol = 1e-5 if adt == F32 else 1e-12
            ck.close(total, full.reshape(total.shape), f"{tag} EF invariant[{name!r}]", tol)
        wires = red.stats.tensors
        for name, x in xs[me].items():
            plan = ref.matrix_of(x.shape, rank, rate)
            want_wire = (plan[0] + plan[1]) * plan[2] * ref.acc_dtype(x.dtype).itemsize if plan else x.size * ref.acc_dtype(x.dtype).itemsize
            ck.true(wires[name]["wire_bytes"] == want_wire, f"{tag} wire_bytes[{name!r}] {wires[name]['wire_bytes']}, want {want_wire}")
    return red, sim


def case_powersgd(comm, ck):
    _psgd_run(ck, comm, steps=4)
    _psgd_run(ck, comm, steps=3, warm=False, pseed=7, average=False)
    _psgd_run(ck, comm, steps=3, rank=1, rate=1.0, error_feedback=False)
    _psgd_run(ck, comm, steps=2, rank=3, layout=[("w", (30, 40), F32, "randn"), ("d", (12, 16), F64, "randn")])


def case_powersgd_state(comm, ck):
    """state_dict after 2 steps continues identically in a fresh Allreducer."""
    p, me = ck.size, ck.rank
    spec = _spec(2, True, 2.0, 4)
    a = Allreducer(spec, comm)
    for step in range(2):
        a.reduce(_inputs(41, step, PS_LAYOUT, p)[me])
    state = a.state_dict()
    b = Allreducer(spec, comm)
    b.load_state_dict(state)
    for step in range(2, 4):
        xs = _inputs(41, step, PS_LAYOUT, p)[me]
        ga, gb = a.reduce(xs), b.reduce(xs)
        for name in ga:
            ck.same(gb[name], ga[name], f"powersgd after load_state_dict, step {step}, [{name!r}]")
            ck.same(_psgd_residual(b, name), _psgd_residual(a, name), f"powersgd residual after load_state_dict [{name!r}]")


def case_powersgd_lowrank(comm, ck):
    """Every rank holds the same rank-1 matrix: the average is that matrix (rank 1 and rank 2,
    whose second column the epsilon guard zeroes), and again on the next step."""
    me = ck.rank
    layout = [("m", (48, 40), F32, "lowrank"), ("d", (20, 36), F64, "lowrank")]
    for r in (1, 2):
        red = Allreducer(_spec(r, True, 2.0, 0), comm)
        for step in range(2):
            xs = ref.make_inputs(3, me, 0, layout)
            got = red.reduce(xs)
            for name, x in xs.items():
                err = float(np.linalg.norm(got[name].astype(F64) - x) / np.linalg.norm(x.astype(F64)))
                tol = 1e-6 if x.dtype == F32 else 1e-12
                ck.true(err <= tol, f"rank-{r} recovery of a rank-1 [{name!r}] step {step}: relative error {err:.3g} > {tol:g}")
        wire = red.stats.tensors["m"]["wire_bytes"]
        ck.true(wire == (48 + 40) * r * 4, f"rank {r}: wire_bytes {wire}, want {(48 + 40) * r * 4}")


CASES = {
    "gtopk": case_gtopk,
    "gtopk_options": case_gtopk_options,
    "gtopk_bytes": case_gtopk_bytes,
    "gtopk_state": case_gtopk_state,
    "powersgd": case_powersgd,
    "powersgd_state": case_powersgd_state,
    "powersgd_lowrank": case_powersgd_lowrank,
}


def run_case(comm, name) -> list[str]:
    """Run one case on ``comm``; the list of failures on this rank."""
    return harness_run_case(CASES, comm, name, SchemeChecks)


if __name__ == "__main__":
    sys.exit(main(CASES, sys.argv[1:], checks=SchemeChecks))
