"""Private helpers that several CPU kernel families share (Numba CPU).

No family imports another family's private names: what two of them need lives here.  Nothing
in this module is part of a family's contract (``__all__``); a CUDA twin keeps its own
equivalents beside its kernels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from codec import layout
from codec._jit import jit
from codec.layout import CHUNK, SPAN

#: loop indices are unsigned: Numba then drops the negative-index wraparound from every
#: array access (AdaComp's test loop ran 2.2x faster, 12.4 -> 5.6 ms for 25M)
U = np.uint64

#: values per chunk of the trit kernels (a multiple of 5, so chunks fill whole bytes); the
#: encoder (quantize.terngrad_encode) and the decoder (dequant.trits_dequantize) use it
TRIT_CHUNK = 65535

def target_has(feature: str) -> bool:
    """Whether Numba compiles for an x86-64 CPU with ``feature`` (LLVM's name: "sse4.2",
    "f16c"): the host's features, or the ones ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` name
    (a portable cache built for a generic x86-64 must not contain the instruction: LLVM
    aborts the process when it cannot select it)."""
    import platform

    import llvmlite.binding as llvm
    from numba.core import config

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if config.CPU_FEATURES is not None:
        return f"+{feature}" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME is not None and config.CPU_NAME != "host":
        return False  # a named target without its features listed: assume the least
    try:
        return bool(llvm.get_host_cpu_features().get(feature, False))
    except RuntimeError:  # pragma: no cover - features unknown
        return False


#: :func:`codec.layout.group_buckets` compiled for the kernels (the one definition of a
#: bucket group)
group_buckets = jit(layout.group_buckets)
#: :func:`codec.layout.chunks` compiled for the kernels: how many CHUNK-value chunks
chunks = jit(layout.chunks)
#: :func:`codec.layout.feistel_half` compiled for the kernels (random-k's runs)
feistel_half = jit(layout.feistel_half)
#: :func:`codec.layout.sample_rank` compiled for the kernels (the sparsifiers' sampled cut)
sample_rank = jit(layout.sample_rank)


@jit
def chunk_sums(src, lo, hi, shift, width):
    """float64 sum and sum of squares of ``src[lo:hi] - shift``, accumulated in ``width``
    column lanes (row by row, then the lanes in order, then the tail).  A shift near the mean
    keeps the variance free of cancellation when |mean| >> std.

    The inner loop runs over columns, so it is elementwise and LLVM's loop vectoriser packs
    it into SIMD without reassociating anything; ``width`` must be a runtime value (a
    constant would be unrolled into scalars, and Numba has the SLP vectoriser off).
    Measured 0.17 ns/element against 0.96 for four scalar lanes."""
    cs = np.zeros(width)
    cq = np.zeros(width)
    rows = (hi - lo) // width
    for row in range(U(rows)):
        base = U(lo) + row * U(width)
        for col in range(U(width)):
            v = np.float64(src[base + col]) - shift
            cs[col] += v
            cq[col] += v * v
    s = 0.0
    q = 0.0
    for col in range(width):
        s += cs[col]
        q += cq[col]
    for i in range(U(lo + rows * width), U(hi)):
        v = np.float64(src[i]) - shift
        s += v
        q += v * v
    return s, q


@jit
def form(x, r, acc, lo, hi):
    """``acc[lo:hi] = x + r`` in the arrays' dtype: the error-feedback sum, where a fused
    kernel leaves it as it is (QSGD's bucket holding a NaN/inf: the error names it there)."""
    for i in range(U(lo), U(hi)):
        acc[i] = x[i] + r[i]


@jit(inline="always")
def summed(x, r, i):
    """``x[i]``, or ``x[i] + r[i]`` in the arrays' dtype when ``r`` is an array (None: compiled
    out): the error-feedback sum read where it is coded, so a fused kernel writes ``acc``
    once, its new residual, instead of forming it first (:func:`form`) and writing it again
    (fp8's step: 15.4-17.7 -> 11.1 ms for 25M float32)."""
    if r is None:
        return x[i]
    return x[i] + r[i]


@jit(inline="always")
def bits_of(v, is64):
    """The bit pattern of float32 ``v`` (or, with ``is64``, of float64 ``v``) as an int64, a
    float32's sign-extended: a sum's bits where no array holds it (integer keys and maxima)."""
    if is64:
        return np.float64(v).view(np.int64)
    return np.int64(np.float32(v).view(np.int32))


@jit(inline="always")
def top_of(like):
    """The largest finite value of ``like``'s dtype (a float32 or float64 array), as float64."""
    return 3.4028234663852886e38 if like.itemsize == 4 else 1.7976931348623157e308


@jit(inline="always")
def saturated(v, like):
    """float64 ``v`` clipped to the finite range of ``like``'s dtype (a float32 or float64
    array): what a decoder makes of a value beyond it (``Quantizer.write``), so a fused
    error-feedback step subtracts exactly what its frame decodes to."""
    top = top_of(like)
    return min(max(v, -top), top)


@jit
def span_end(i, hi):
    """End of the run from ``i`` that shares ``i``'s random block key (at most ``hi``)."""
    return min(hi, (i | (SPAN - 1)) + 1)


@jit(inline="always")
def mul(a, b):
    """``a * b``, rounded on its own before anything adds to it: what every product here is (LLVM
    contracts nothing without fastmath).  The shared scalar rules write a product whose rounding
    a result depends on with it, so a CUDA twin compiled from their source binds
    ``codec.kernels.cuda._common.mul`` (NVVM would fuse it into a following sum)."""
    return a * b


@jit(inline="always")
def floor(t):
    """``floor(t)`` of a float64, as a float64.  This, :func:`rint` and :func:`copysign` are
    the float rules the shared scalar functions call by name, so a CUDA twin compiled from
    their source binds its own (libdevice's: NumPy's ufuncs do not compile for CUDA)."""
    return np.floor(t)


@jit(inline="always")
def rint(t):
    """``t`` rounded to an integer-valued float64, half to even."""
    return np.rint(t)


@jit(inline="always")
def copysign(a, b):
    """``|a|`` with ``b``'s sign (float64)."""
    return np.copysign(a, b)


@jit
def floor_plus(t, u):
    """``floor(t + u)`` for ``t >= 0`` and ``u`` in [0, 1), exactly: ``floor(t) + (frac(t) >= 1 - u)``
    (each step is exact in float64, where ``t + u`` itself may round)."""
    f = floor(t)
    return f + np.float64(t - f >= 1.0 - u)


@jit(inline="always")
def floor_plus_bits(t, bits):
    """``floor(t + bits / 2**32)`` as a uint64, for ``0 <= t < 2**32`` and 32 random ``bits``:
    :func:`floor_plus` with ``u = bits / 2**32``, exactly, in integers.  With ``T =
    floor(t * 2**32)`` (the scaling exact) the result is ``(T + bits) >> 32``: the fraction's
    ``floor(frac(t) * 2**32)`` plus ``bits`` carries into the integer part exactly when
    ``frac(t) >= 1 - u`` (:func:`floor_plus`'s test; the CUDA twins keep that one).  One
    conversion and an integer add in place of a floor, the bits' conversion, two
    subtractions and a compare: qsgd's coding loop 0.82 -> 0.59 ns a value in L1."""
    return (U(t * 4294967296.0) + U(bits)) >> U(32)


def emit_prefetch(builder, ptr, write: bool, locality: int) -> None:
    """Emit ``llvm.prefetch`` of the cache line at ``ptr`` (for reading or writing; locality
    0-3, 3 keeping it closest): the code generation :func:`prefetch` and the register
    kernels' read-ahead (``_ranks``) share."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, int(write)), ir.Constant(i32, locality), ir.Constant(i32, 1)])


@intrinsic
def prefetch(typingctx, arr, i):
    """Ask the CPU to start loading the cache line of ``arr[i]`` for writing (LLVM's
    ``llvm.prefetch``, read-write, high locality; a no-op on a target without prefetch).

    A hint only: it changes no result and never faults, so ``i`` may be any index the caller
    will use soon.  A scatter to sorted, sparse positions reads a new cache line per value
    that the hardware prefetcher cannot predict; asking 64 values ahead measured 1.18 ->
    0.49 ms for 217k positions in a cold 100 MB array."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(i, types.Integer):
        return None  # one flat index: the address of arr[i] in a 1-D array

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False, boundscheck=False)
        emit_prefetch(builder, ptr, write=True, locality=3)
        return context.get_dummy_value()

    return types.void(arr, i), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's ``llvm.fma``: the fused multiply-add, exact on every
    target, in hardware where there is one), for three float32 or three float64 values: what a
    BLAS micro-kernel computes, written down so a result does not depend on the BLAS."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(signature.args[0])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), f"llvm.fma.f{a.bitwidth}")
        return builder.call(fn, args)

    return a(a, b, c), codegen


@jit
def owner(starts, i):
    """The last ``t`` with ``starts[t] <= i`` (``starts`` non-decreasing), -1 when none: a
    binary search.  With ``starts[0] <= i < starts[-1]``, the segment holding ``i`` (the last
    of equal starts: empty segments are skipped).  The CUDA twins' ``_common.owner`` is this
    function compiled as a device function."""
    lo = np.int64(-1)
    hi = np.int64(starts.size)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= i:
            lo = mid
        else:
            hi = mid
    return lo


@jit
def run_pieces(starts):
    """Every tensor of a run cut at the run's chunk boundaries (multiples of ``CHUNK``):
    rows ``(t, a, b)``, the run's positions ``a:b`` of tensor ``t`` (``starts`` as
    :func:`chunk_segments` takes it), in order, empty tensors left out.  A segmented kernel
    whose work is elementwise runs ``prange`` over them: its parallel tasks, cut by the run's
    length alone, never depend on the thread count."""
    count = starts.size - 1
    total = np.int64(0)
    for t in range(count):
        if starts[t + 1] > starts[t]:
            total += (starts[t + 1] - 1) // CHUNK - starts[t] // CHUNK + 1
    rows = np.empty((total, 3), np.int64)
    k = 0
    for t in range(count):
        a = starts[t]
        while a < starts[t + 1]:
            b = min(starts[t + 1], (a // CHUNK + 1) * CHUNK)
            rows[k, 0] = t
            rows[k, 1] = a
            rows[k, 2] = b
            k += 1
            a = b
    return rows


@jit
def task_span(done, task, tasks):
    """The pieces ``first:last`` of task ``task`` of ``tasks``: runs of pieces of about equal
    work (``done``: the work before each piece, and in all).  A parallel loop over such tasks
    balances pieces of unequal work that a static split by their count would not."""
    npiece = done.size - 1
    first = np.searchsorted(done[:npiece], done[npiece] * task // tasks)
    last = npiece if task == tasks - 1 else np.searchsorted(done[:npiece], done[npiece] * (task + 1) // tasks)
    return first, last


@jit
def chunk_segments(starts, lo, hi):
    """The tensors that positions ``lo:hi`` of a run cross (tensor ``t`` holds positions
    ``starts[t]:starts[t+1]`` of the run; ``starts[0] <= lo < hi <= starts[-1]``): rows
    ``(t, a, b)``, the run's positions ``a:b`` of tensor ``t`` in the range, in order, empty
    tensors left out.  How a segmented kernel's chunk (cut by the run's length alone) finds
    the tensors it writes."""
    first = owner(starts, lo)
    t = first
    count = 0
    while t < starts.size - 1 and starts[t] < hi:
        count += np.int64(starts[t + 1] > max(lo, starts[t]))
        t += 1
    rows = np.empty((count, 3), np.int64)
    k = 0
    t = first
    while k < count:
        a = max(lo, starts[t])
        b = min(hi, starts[t + 1])
        if b > a:
            rows[k, 0] = t
            rows[k, 1] = a
            rows[k, 2] = b
            k += 1
        t += 1
    return rows


@jit
def address_of(a):
    """The data address of the host array ``a``, as an int (what :func:`view_at` takes): one
    call costs a seventh of reading it from Python's ``__array_interface__``, which builds a
    dict for each array (161 arrays: 78 against 541 µs)."""
    return a.ctypes.data


@intrinsic
def view_at(typingctx, like, addr, n):
    """A 1-D C-contiguous array of ``n`` items of ``like``'s dtype at the address ``addr`` (an
    int64): another array's memory, which the caller keeps alive for the call.  How one
    kernel call writes many separate arrays (each tensor's output of a many-tensor decode)
    without a list of arrays, which Numba would box and unbox element by element."""
    if not isinstance(like, types.Array) or not isinstance(addr, types.Integer) or not isinstance(n, types.Integer):
        return None
    arrty = types.Array(like.dtype, 1, "C")

    def codegen(context, builder, signature, args):
        _, at, count = args
        item = context.get_data_type(arrty.dtype)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(item))
        count = context.cast(builder, count, signature.args[2], types.intp)
        at = context.cast(builder, at, signature.args[1], types.int64)
        ary = context.make_array(arrty)(context, builder)
        context.populate_array(
            ary,
            data=builder.inttoptr(at, item.as_pointer()),
            shape=cgutils.pack_array(builder, [count]),
            strides=cgutils.pack_array(builder, [itemsize]),
            itemsize=itemsize,
            meminfo=None,
        )
        return ary._getvalue()

    return arrty(like, addr, n), codegen


@intrinsic
def copy_bytes(typingctx, dst, at, src, frm, n):
    """``dst[at:at+n] = src[frm:frm+n]`` for 1-D C-contiguous uint8 arrays (LLVM's
    ``memcpy``; the caller has checked both ranges, and the two never overlap).  A byte loop
    copying the raw values of a sparse frame out of its payload did not vectorise: ResNet-50's
    1 MB of top-k values took 0.60 ms, a slice assignment 0.23 ms (its overlap check and
    element loop), this 0.03 ms."""
    ok = all(isinstance(a, types.Array) and a.dtype == types.uint8 and a.ndim == 1 and a.layout == "C" for a in (dst, src))
    if not ok or not all(isinstance(i, types.Integer) for i in (at, frm, n)):
        return None

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        at, frm, n = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 3, 4))
        cgutils.raw_memcpy(builder, builder.gep(d.data, [at]), builder.gep(s.data, [frm]), n, 1)
        return context.get_dummy_value()

    return types.none(dst, at, src, frm, n), codegen
