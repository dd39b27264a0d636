"""The transport's checks on any number of ranks; tests/test_transport.py runs them.

    mpiexec -n P python -m mpi4py tests/mpi_transport.py CASE [CASE ...]     (or "all")

Every case is a function of a communicator, run by the one MPI harness (tests/support/mpi.py:
the pytest process calls each one on ``MPI.COMM_SELF`` (p = 1), the launches run them on
``COMM_WORLD``, and the harness prints ``OK`` / ``FAIL`` / ``ERROR`` lines).  Every rank makes
the inputs of EVERY rank deterministically (reference.transport.make_inputs, from the seed and
the rank), so it can run the serial reference (reference.transport.Reference) for the whole job
locally and compare its own result with it bit for bit; a hash of the result is also
allgathered, so the ranks must agree with each other.

The ``raise`` case is the exception: rank 1 raises RuntimeError while the others are inside
``reduce``; the job must end, non-zero, without hanging.  It needs two ranks or more, and
ends the job, so it runs only in its own launch.

Imports: tests/ is on sys.path (for ``reference`` and ``support``) and the launcher puts the
repository root on PYTHONPATH, as tests/support/mpi.py says.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from reference.transport import BF16, F16, F32, F64, MIXED, SMALL, Reference, dense_reference, items, make_inputs, same_bits
from support.mpi import Checks, main as harness_main, run_case as harness_run_case, say
from transport import Allreducer, MismatchError


class TransportChecks(Checks):
    def everyone(self, seed, step, layout=MIXED, kind="dict"):
        """Every rank's inputs of ``step``."""
        return [make_inputs(seed, r, step, layout, kind) for r in range(self.size)]


def check_same(ck, got, want, label) -> bool:
    """``got`` has ``want``'s structure, names, shapes, dtypes and bits."""
    if type(got) is not type(want):
        return ck.fail(f"{label}: returned a {type(got).__name__}, expected a {type(want).__name__}")
    gk, ga = items(got)
    wk, wa = items(want)
    if gk != wk:
        return ck.fail(f"{label}: keys {gk} != {wk}")
    return all(ck.same(g, w, f"{label}: {k!r}") for k, g, w in zip(gk, ga, wa))


def run(ck, spec, *, steps=2, layout=SMALL, seed=0, kind="dict", check_stats=True, **opts):
    """``steps`` reduce calls of ``spec`` against the reference; returns (reducer, ref, last result)."""
    rank, size = ck.rank, ck.size
    red = Allreducer(spec, ck.comm, **opts)
    ref = Reference(spec, size, **opts)
    label = f"{spec} {opts}"
    got = None
    for s in range(steps):
        per_rank = ck.everyone(seed, s, layout, kind)
        got = red.reduce(per_rank[rank])
        want = ref.step(per_rank)
        check_same(ck, got, want, f"{label} step {s}")
        ck.agree(got, f"{label} step {s}")
        if check_stats:
            st = red.stats
            if st.bytes_sent != ref.message_bytes(rank, per_rank[rank]):
                ck.fail(f"{label}: bytes_sent {st.bytes_sent}, the message has {ref.message_bytes(rank, per_rank[rank])} bytes")
            others = sum(ref.message_bytes(r, per_rank[r]) for r in range(size) if r != rank)
            if st.bytes_received != others:
                ck.fail(f"{label}: bytes_received {st.bytes_received}, the other ranks sent {others}")
            names, _ = items(per_rank[rank])
            wire = {str(k): st.tensors[str(k)]["wire_bytes"] for k in names}
            if wire != {str(k): w for k, w in zip(names, ref.wire(rank, per_rank[rank]))}:
                ck.fail(f"{label}: wire_bytes {wire} do not match the message")
    if red.calls != steps:
        ck.fail(f"{label}: calls {red.calls} after {steps} steps")
    return red, ref, got


# ---------------------------------------------------------------------- cases
def case_codecs(comm, ck):
    """Several codecs (deterministic, stochastic, lossless, sign with vote), two steps each."""
    configs = [
        ("topk(ratio=0.01)+fp16", {}),
        ("qsgd(levels=16)", {}),
        ("qsgd(levels=16)", {"rank_streams": False}),
        ("qsgd(levels=16)", {"error_feedback": False}),  # the stream's step is the key's step
        ("adacomp", {}),
        ("randomk(ratio=0.01)", {}),
        ("fp16", {}),
        ("bf16", {"error_feedback": False}),
        ("none+zstd", {}),  # lossless: the allgather scheme without error feedback
        ("sign", {"vote": True}),
        ("efsign", {"vote": True, "average": False}),
    ]
    for spec, opts in configs:
        red, ref, got = run(ck, spec, **opts)
        if opts.get("vote"):
            for k, a in got.items():
                if not np.isin(a.astype(np.float64), (-1.0, 0.0, 1.0)).all():
                    ck.fail(f"{spec} vote: {k!r} holds values other than -1, 0, +1")
    # without the rank in the stream key, random-k picks the same positions on every rank, so
    # the sum has at most k nonzeros; with it (the default) the ranks' picks differ
    big = (("g", (100_000,), F32),)
    k = 1000
    for streams in (False, True):
        _, _, got = run(ck, "randomk(ratio=0.01)", layout=big, steps=1, rank_streams=streams, error_feedback=False)
        nz = int(np.count_nonzero(got["g"]))
        if not streams and nz > k:
            ck.fail(f"randomk rank_streams=False: {nz} nonzeros, the ranks picked different positions")
        if streams and ck.size > 1 and nz <= k:
            ck.fail(f"randomk rank_streams=True: only {nz} nonzeros, the ranks picked the same positions")


def case_structure(comm, ck):
    """Mixed dtypes with a 0-element tensor among large ones, lists, tuples, empty inputs."""
    run(ck, "topk(ratio=0.01)+fp16", layout=MIXED, steps=2, seed=1)
    run(ck, "qsgd(levels=16)", layout=MIXED, steps=1, seed=2)
    run(ck, "fp16", layout=MIXED, steps=1, seed=3, kind="list")
    run(ck, "topk(ratio=0.01)", layout=SMALL, steps=2, seed=4, kind="tuple")
    # keys keep the caller's order (not sorted)
    order = (("zeta", (10,), F32), ("alpha", (5,), F16), ("mid", (7,), BF16))
    _, _, got = run(ck, "fp16", layout=order, steps=1, seed=5)
    if list(got) != ["zeta", "alpha", "mid"]:
        ck.fail(f"dict order not kept: {list(got)}")
    for empty in ({}, []):
        for spec in ("topk(ratio=0.01)", "none"):
            red = Allreducer(spec, comm)
            for _ in range(2):
                got = red.reduce(empty)
                if got != empty or type(got) is not type(empty):
                    ck.fail(f"{spec}: reducing {empty!r} gave {got!r}")
    # only empty tensors
    zeros = (("a", (0,), F16), ("b", (0, 4), F64))
    run(ck, "adacomp", layout=zeros, steps=2, seed=6)


def case_ef(comm, ck):
    """Error feedback over 4 steps: results and every rank's residuals match the reference."""
    rank, size = ck.rank, ck.size
    for spec, opts in (("topk(ratio=0.01)+fp16", {}), ("qsgd(levels=16)", {"rank_streams": False}), ("adacomp", {})):
        red = Allreducer(spec, comm, **opts)
        ref = Reference(spec, size, **opts)
        for s in range(4):
            per_rank = ck.everyone(7, s, SMALL)
            got = red.reduce(per_rank[rank])
            check_same(ck, got, ref.step(per_rank), f"{spec} {opts} step {s}")
            ck.agree(got, f"{spec} {opts} step {s}")
            for name, _, _ in SMALL:
                key = (name, rank) if opts.get("rank_streams", True) else name
                mine, want = red.scheme.ef.residual(key), ref.residual(rank, name)
                if not same_bits(mine, want):
                    ck.fail(f"{spec} step {s}: residual of {name!r} differs from the reference")
        if s == 3 and not any(np.any(ref.residual(rank, n) != 0) for n, _, _ in SMALL):
            ck.fail(f"{spec}: no residual after 4 steps; the check proves nothing")
        # the reducer's checkpoint holds this rank's residuals
        state = red.state_dict()
        if state["rank"] != rank or state["size"] != size:
            ck.fail(f"state_dict names rank {state['rank']} of {state['size']}")
        saved = {s["key"]: s["residual"] for s in state["feedback"]["slots"]}
        for name, _, _ in SMALL:
            key = (name, rank) if opts.get("rank_streams", True) else name
            if not same_bits(saved[key], ref.residual(rank, name)):
                ck.fail(f"{spec}: the checkpoint's residual of {name!r} differs from the reference")


def case_ireduce(comm, ck):
    """Two steps in flight, waited in order; inputs changed after ireduce do not leak in."""
    rank, size = ck.rank, ck.size
    for spec in ("topk(ratio=0.01)+fp16", "qsgd(levels=16)", "none"):
        red = Allreducer(spec, comm)
        ref = Reference(spec, size)
        a, b = ck.everyone(8, 0, SMALL), ck.everyone(8, 1, SMALL)
        mine_a = {k: v.copy() for k, v in a[rank].items()}
        mine_b = {k: v.copy() for k, v in b[rank].items()}
        h1 = red.ireduce(mine_a)
        h2 = red.ireduce(mine_b)
        for v in list(mine_a.values()) + list(mine_b.values()):
            v[...] = 7  # the step was encoded / staged at ireduce
        r1 = h1.wait()
        r2 = h2.wait()
        if h1.wait() is not r1 or not h1.test() or not h2.test():
            ck.fail(f"{spec}: a finished handle must keep its result and test() True")
        want1, want2 = ref.step(a), ref.step(b)
        if spec == "none":
            if size <= 2:  # a + b is the same in any order
                check_same(ck, r1, want1, "none ireduce 1")
                check_same(ck, r2, want2, "none ireduce 2")
            check_dense(ck, r1, a, True, "none ireduce 1")
            check_dense(ck, r2, b, True, "none ireduce 2")
        else:
            check_same(ck, r1, want1, f"{spec} ireduce 1")
            check_same(ck, r2, want2, f"{spec} ireduce 2")
        ck.agree(r1, f"{spec} ireduce 1")
        ck.agree(r2, f"{spec} ireduce 2")
        if red.calls != 2:
            ck.fail(f"{spec}: calls {red.calls} after two waits")
        # a handle polled with test() until done
        h = red.ireduce(ck.everyone(8, 2, SMALL)[rank])
        t0 = time.monotonic()
        while not h.test():
            if time.monotonic() - t0 > 30:
                ck.fail(f"{spec}: test() never became True")
                break
            time.sleep(0.001)
        want3 = ref.step(ck.everyone(8, 2, SMALL))
        got3 = h.wait()
        if spec != "none":
            check_same(ck, got3, want3, f"{spec} after test()")
        ck.agree(got3, f"{spec} after test()")


def case_average(comm, ck):
    """average=False: the plain sum (the allgather scheme and MPI Allreduce)."""
    for spec in ("topk(ratio=0.01)+fp16", "fp16", "sign"):
        run(ck, spec, steps=2, seed=9, average=False)
    red = Allreducer("none", comm, average=False)
    per_rank = ck.everyone(9, 0, MIXED)
    got = red.reduce(per_rank[ck.rank])
    check_dense(ck, got, per_rank, False, "none average=False")
    ck.agree(got, "none average=False")


def check_dense(ck, got, per_rank, average, label) -> bool:
    for (k, g), (exact, bound) in zip(got.items(), dense_reference(per_rank, average=average)):
        if g.dtype != per_rank[ck.rank][k].dtype or g.shape != per_rank[ck.rank][k].shape:
            return ck.fail(f"{label}: {k!r} is {g.dtype}{g.shape}")
        err = np.abs((g.astype(np.float32) if g.dtype == BF16 else g).astype(np.float64) - exact)
        if not np.all(err <= bound):
            i = int(np.argmax(err - bound))
            return ck.fail(f"{label}: {k!r} is off the exact sum by {err.reshape(-1)[i]} > {bound.reshape(-1)[i]}")
    return True


def case_none(comm, ck):
    """The dense baseline: the sum within rounding, identical on every rank (exact for 2 ranks)."""
    rank, size = ck.rank, ck.size
    red = Allreducer("none", comm)
    ref = Reference("none", size)  # lossless: decode_add in rank order, the exact order of 2 ranks
    for s in range(2):
        per_rank = ck.everyone(10, s, MIXED)
        got = red.reduce(per_rank[rank])
        want = ref.step(per_rank)
        check_dense(ck, got, per_rank, True, f"none step {s}")
        if size <= 2:
            check_same(ck, got, want, f"none step {s}")
        ck.agree(got, f"none step {s}")
        dense = {k: a.nbytes for k, a in per_rank[rank].items()}
        if {k: v["wire_bytes"] for k, v in red.stats.tensors.items()} != dense:
            ck.fail(f"none: wire_bytes {red.stats.tensors} are not the dense sizes")
    if red.state_dict()["feedback"] is not None:
        ck.fail("none: the state holds feedback; MPI Allreduce keeps no memory")
    lst = ck.everyone(11, 0, SMALL, "list")
    got = Allreducer("none", comm).reduce(lst[rank])
    if not isinstance(got, list) or [a.dtype for a in got] != [a.dtype for a in lst[rank]]:
        ck.fail("none: a list input did not come back as a list of the same dtypes")
    ck.agree(got, "none list")


def expect_mismatch(ck, label, build, call, contains):
    """Every rank raises MismatchError with the same message (and nobody hangs).  On one rank
    there is nobody to disagree with: the step must go through."""
    red = build()
    try:
        call(red)
    except MismatchError as e:
        msg = str(e)
        if not isinstance(e, ValueError):
            ck.fail(f"{label}: MismatchError is not a ValueError")
    else:
        msg = None
    msgs = ck.comm.allgather(msg)
    if ck.size == 1:
        if msg is not None:
            ck.fail(f"{label}: one rank raised MismatchError ({msg}); it has nobody to disagree with")
        return red
    if any(m is None for m in msgs):
        ck.fail(f"{label}: ranks {[r for r, m in enumerate(msgs) if m is None]} did not raise MismatchError ({msgs})")
        return red
    if len(set(msgs)) != 1:
        ck.fail(f"{label}: ranks raised different messages: {msgs}")
    for part in contains:
        if part not in msgs[0]:
            ck.fail(f"{label}: the message {msgs[0]!r} does not mention {part!r}")
    return red


def case_mismatch(comm, ck):
    """Ranks that disagree on the step all raise the same MismatchError, and go on."""
    rank, size = ck.rank, ck.size
    last = size - 1
    base = make_inputs(12, rank, 0, SMALL)

    def shape_differs(red):
        x = dict(base)
        if rank == last:
            x["w32"] = np.zeros(1999, np.float32)
        red.reduce(x)

    def dtype_differs(red):
        x = dict(base)
        if rank == last:
            x["w32"] = x["w32"].astype(np.float64)
        red.reduce(x)

    def name_differs(red):
        x = dict(base)
        if rank == last:
            x = {("other" if k == "w32" else k): v for k, v in x.items()}
        red.reduce(x)

    def count_differs(red):
        x = dict(base)
        if rank == last:
            x.pop("w64")
        red.reduce(x)

    def list_vs_dict(red):
        red.reduce(list(base.values()) if rank == last else base)

    spec = "qsgd(levels=16)"
    expect_mismatch(ck, "shape", lambda: Allreducer(spec, comm), shape_differs, ["'w32'", f"rank {last}", "1999", "2000"])
    expect_mismatch(ck, "dtype", lambda: Allreducer(spec, comm), dtype_differs, ["'w32'", "float64", "float32"])
    expect_mismatch(ck, "name", lambda: Allreducer(spec, comm), name_differs, ["'other'", "'w32'"])
    expect_mismatch(ck, "count", lambda: Allreducer(spec, comm), count_differs, [f"rank {last}"])
    expect_mismatch(ck, "structure", lambda: Allreducer(spec, comm), list_vs_dict, ["structure"])
    expect_mismatch(ck, "codec", lambda: Allreducer("fp16" if rank == last else "topk(ratio=0.01)+fp16", comm), lambda r: r.reduce(base), ["fp16", "topk"])
    expect_mismatch(ck, "dense vs allgather", lambda: Allreducer("none" if rank == last else "fp16", comm), lambda r: r.reduce(base), ["none", "fp16"])
    expect_mismatch(ck, "options", lambda: Allreducer(spec, comm, average=(rank != last)), lambda r: r.reduce(base), ["options"])
    expect_mismatch(ck, "rank_streams", lambda: Allreducer(spec, comm, rank_streams=(rank != last)), lambda r: r.reduce(base), ["options"])

    # a rejected step encodes nothing: the reducer goes on as if it never happened (error
    # feedback residuals and the stochastic stream's step included); one rank has no
    # rejected step to go on from
    if size == 1:
        return
    for opts in ({}, {"error_feedback": False}):
        red = expect_mismatch(ck, f"then continue {opts}", lambda: Allreducer(spec, comm, **opts), shape_differs, ["'w32'"])
        ref = Reference(spec, size, **opts)
        for s in range(2):
            per_rank = ck.everyone(13, s, SMALL)
            got = red.reduce(per_rank[rank])
            check_same(ck, got, ref.step(per_rank), f"after a mismatch {opts} step {s}")
            ck.agree(got, f"after a mismatch {opts} step {s}")


def case_nonfinite(comm, ck):
    """One rank's input cannot be encoded (inf into a codec that needs finite input): every
    rank must raise the same ValueError (transport.RankError; none left in a collective the
    others skipped), and the reducer must stay usable for the next step.  The last rank is
    the victim (rank 1 of 2)."""
    rank, size = ck.rank, ck.size
    red = Allreducer("topk(ratio=0.01)", comm)
    x = make_inputs(15, rank, 0, SMALL)
    if rank == size - 1:
        x["w32"] = x["w32"].copy()
        x["w32"][3] = np.inf
    try:
        red.reduce(x)
        err = None
    except Exception as e:  # noqa: BLE001 - the type is the check
        err = (isinstance(e, ValueError), f"{type(e).__module__}.{type(e).__name__}: {str(e)[:300]}")
    errs = comm.allgather(err)
    if not all(e is not None and e[0] for e in errs) or len(set(errs)) != 1:
        ck.fail(f"a non-finite input on rank {size - 1}: every rank must raise the same ValueError, got {errs}")
    elif "non-finite" not in errs[0][1]:
        ck.fail(f"the error does not say non-finite: {errs[0][1]}")
    got = red.reduce(make_inputs(15, rank, 1, SMALL))
    ck.agree(got, "the step after a rank-local error")


def case_raise(comm, ck):
    """Rank 1 raises while the others wait inside reduce: the job must abort, not hang."""
    rank = ck.rank
    red = Allreducer("topk(ratio=0.01)", comm)
    x = make_inputs(14, rank, 0, SMALL)
    red.reduce(x)  # one good step first
    if rank == 1:
        time.sleep(0.5)  # the others are blocked in the step's first collective by now
        raise RuntimeError("rank 1 failed mid-step")
    red.reduce(x)
    say(f"UNREACHABLE rank {rank}: reduce returned without rank 1")


def case_out(comm, ck):
    """``reduce(tensors, out=...)`` writes into the caller's arrays (fresh ones holding garbage,
    or the inputs themselves) the same bits ``reduce`` returns, for every scheme."""
    configs = [
        ("none", {}),
        ("topk(ratio=0.01)+fp16", {}),
        ("qsgd(levels=16)", {}),
        ("fp16", {"average": False}),
        ("sign", {"vote": True}),
        ("gtopk(ratio=0.01)", {}),
        ("powersgd(rank=2)", {}),
        ("topk(ratio=0.01)", {"bucket_bytes": 4096}),
    ]
    for spec, opts in configs:
        plain, fresh, alias = (Allreducer(spec, comm, **opts) for _ in range(3))
        for step in range(2):
            mine = ck.everyone(7, step, MIXED, "dict")[ck.rank]
            want = plain.reduce({k: v.copy() for k, v in mine.items()})
            out = {k: np.full_like(v, 3.0) for k, v in mine.items()}
            got = fresh.reduce({k: v.copy() for k, v in mine.items()}, out=out)
            ck.true(got is out, f"{spec} {opts}: reduce(out=) did not return out")
            inputs = {k: v.copy() for k, v in mine.items()}
            got2 = alias.reduce(inputs, out=inputs)
            for k in want:
                ck.same(out[k], want[k], f"{spec} {opts} step {step} out[{k!r}]")
                ck.same(got2[k], want[k], f"{spec} {opts} step {step} out=inputs [{k!r}]")
            ck.agree(out, f"{spec} {opts} step {step}")


CASES = {
    "codecs": case_codecs,
    "structure": case_structure,
    "ef": case_ef,
    "ireduce": case_ireduce,
    "average": case_average,
    "none": case_none,
    "out": case_out,
    "mismatch": case_mismatch,
    "nonfinite": case_nonfinite,
    "raise": case_raise,
}
#: what "all" runs (not "raise", which ends the job, nor "nonfinite", launched on its own)
ALL = [c for c in CASES if c not in ("raise", "nonfinite")]
#: cases that need this many ranks (the rest run on any communicator, COMM_SELF included)
MIN_RANKS = {"raise": 2}


def run_case(comm, name) -> list[str]:
    """Run one case on ``comm``; the list of failures on this rank."""
    return harness_run_case(CASES, comm, name, TransportChecks)


if __name__ == "__main__":
    sys.exit(harness_main(CASES, sys.argv[1:], every=ALL, checks=TransportChecks))
