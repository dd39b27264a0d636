"""What every CUDA twin shares (the CUDA side of ``codec/kernels/cpu/_common.py``): launch
shapes, the per-context buffer cache, and the device functions the twins call.

Elementwise kernels are grid-stride loops: a launch over ``n`` values (:func:`launch`) uses
enough blocks of :data:`THREADS` for one value per thread, at most :data:`MAX_BLOCKS` (about
two blocks per multiprocessor resident on an H100/H200), each thread striding by the grid's
size.  Results never depend on the launch shape (no kernel sums in thread order; block-wide
scans and sums run in index order).  Device functions: :func:`block_scan`,
:func:`chunk_sums`, :func:`compactor` (the compaction loop), :func:`mul` / ``mul32``, the
float rules the CPU's shared scalar functions call by name (:func:`floor`, :func:`rint`,
:func:`copysign`: :data:`MATH` binds them when a twin compiles those functions).
"""

from __future__ import annotations

import threading
import types

import numpy as np

from codec.dtypes import on_device
from codec._cuda_jit import device_functions, jit, numba_cuda  # (twins import this module; ``import codec`` never does)
from codec.kernels.cpu import _common as _cpu_common

#: the CUDA module: intrinsics are reached through this global, which the simulator swaps
#: for its own.  Warp-level intrinsics would live here, behind the device functions' names,
#: with these shared-memory forms as the simulator's fallback
cuda = numba_cuda()

#: threads per block of every kernel (the size of their shared scan buffers), and the most
#: blocks a launch uses; both read when a launch is shaped (the simulator tests take fewer
#: threads per block: it runs each as a Python thread)
THREADS = 256
MAX_BLOCKS = 1024
#: the block-wide scans' launches (``candidates``, AdaComp's bins, the segmented kernels):
#: threads per block (at most THREADS) and consecutive values a thread tests per stretch (one
#: 64-byte line of float32), read when a call is made like the two above (the simulator
#: tests take fewer threads of more values: a barrier costs it 20-30 ms)
SCAN_BLOCK = THREADS
SCAN_ITEMS = 16


def launch(n: int) -> tuple[int, int]:
    """``(blocks, threads)`` of a grid-stride launch over ``n`` values: ``THREADS`` per block,
    enough blocks for one value per thread, at most ``MAX_BLOCKS`` (``kernel[launch(n)](...)``)."""
    t = THREADS
    return min(MAX_BLOCKS, max(1, (n + t - 1) // t)), t


@jit
def zero(out):
    """``out[:] = 0``: a grid-stride kernel, ``zero[launch(out.size)](out)`` (the scatter
    twin's SET, the index twin's bitmaps and answers)."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = 0


_kept = threading.local()
_SIMULATED = object()


def per_context(key, make):
    """``make()``'s value (device buffers, constants moved to the device), made once per
    thread and CUDA context and kept under ``key``: a kernel call allocates nothing.  (The
    simulator makes a new context object at every call: its one context is ``_SIMULATED``.)"""
    ctx = _SIMULATED if _simulated() else cuda.current_context()
    cache = getattr(_kept, "cache", None)
    if cache is None:
        cache = _kept.cache = {}
    got = cache.get((key, id(ctx)))
    if got is None or got[0] is not ctx:  # (an id reused by a later context)
        got = cache[(key, id(ctx))] = (ctx, make())
    return got[1]



@jit(device=True)
def block_scan(flag, tmp):
    """``(exclusive prefix of flag over the block's threads, the block's total)``: a
    Hillis-Steele scan in shared ``tmp`` (``blockDim.x`` int64 values), every thread of the
    block calling it; ``tmp`` is free again when it returns."""
    t = cuda.threadIdx.x
    tmp[t] = flag
    cuda.syncthreads()
    off = 1
    while off < cuda.blockDim.x:
        v = tmp[t - off] if t >= off else 0
        cuda.syncthreads()
        tmp[t] += v
        cuda.syncthreads()
        off *= 2
    incl = tmp[t]
    total = tmp[cuda.blockDim.x - 1]
    cuda.syncthreads()
    return incl - flag, total


#: the most column lanes :func:`chunk_sums` takes (its shared memory per block)
MAX_WIDTH = 1024


@jit(device=True)
def chunk_sums(src, lo, hi, shift, width):
    """The CPU's ``chunk_sums`` by a block: the float64 sum and sum of squares of ``src[lo:hi]
    - shift`` in ``width`` column lanes (each thread its lanes, each lane its rows in order),
    then thread 0 adding the lanes in order and the tail; the sums are thread 0's answer
    (``(0.0, 0.0)`` elsewhere).  The squares are rounded on their own (:func:`mul`)."""
    t = cuda.threadIdx.x
    cs = cuda.shared.array(MAX_WIDTH, np.float64)
    cq = cuda.shared.array(MAX_WIDTH, np.float64)
    rows = (hi - lo) // width
    for col in range(t, width, cuda.blockDim.x):
        a = 0.0
        b = 0.0
        for r in range(rows):
            v = np.float64(src[lo + r * width + col]) - shift
            a += v
            b += mul(v, v)
        cs[col] = a
        cq[col] = b
    cuda.syncthreads()
    s = 0.0
    q = 0.0
    if t == 0:
        for col in range(width):
            s += cs[col]
            q += cq[col]
        for i in range(lo + rows * width, hi):
            v = np.float64(src[i]) - shift
            s += v
            q += mul(v, v)
    cuda.syncthreads()  # (cs and cq are free again)
    return s, q


def _compact(p, lo, hi, items, at, cap, origin, pos, vals, tmp):
    """Stream compaction in index order, by one block: the positions ``i`` of ``[lo, hi)``
    that ``find(p, i, first)`` marks 1, as ``i - origin``, into ``pos[at:]`` (and their
    values, its second result, into ``vals[at:]`` unless ``vals`` is empty), at most ``cap`` of them (a row of a 2-D
    buffer is ``at = row * cap`` of its flat view); returns ``(found, bad)``, all of the 1s
    and the 2s (non-finite values) counted.  The block walks ``[lo, hi)`` a
    stretch of ``blockDim.x * items`` values at a time: each thread counts the finds of its
    ``items`` consecutive values (``first``: the pass that may also form a value), one
    :func:`block_scan` gives each thread its place, and each thread writes its finds there.
    Not compiled as it stands: :func:`compactor` compiles it with a family's ``find``."""
    t = cuda.threadIdx.x
    found = 0
    nbad = 0
    for base in range(lo, hi, cuda.blockDim.x * items):  # every thread takes every stretch (the scan needs them all)
        a0 = min(hi, base + t * items)
        a1 = min(hi, a0 + items)
        mine = 0
        for i in range(a0, a1):
            k, _ = find(p, i, True)  # noqa: F821  (bound by compactor)
            if k == 2:
                nbad += 1
            elif k == 1:
                mine += 1
        before, total = block_scan(mine, tmp)
        w = found + before
        for i in range(a0, a1):
            if w >= cap:
                break
            k, v = find(p, i, False)  # noqa: F821  (read again: this thread's own line)
            if k == 1:
                pos[at + w] = i - origin
                if vals.size:
                    vals[at + w] = v
                w += 1
        found += total
    _, nbad = block_scan(nbad, tmp)
    return found, nbad


def compactor(find):
    """The block's compaction loop (:func:`_compact`) over a family's test ``find(p, i,
    first) -> (0 skip | 1 keep | 2 non-finite, value)``, a device function: compiled from
    ``_compact``'s source with ``find`` bound among its globals, as
    :func:`codec._cuda_jit.device_functions` rebinds names (one loop for the ``select`` and
    ``adacomp`` twins)."""
    ns = dict(globals())
    ns["find"] = find
    return jit(device=True)(types.FunctionType(_compact.__code__, ns, "_compact"))


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


if _simulated():  # the simulator runs Python: the CPU file's own rules, nothing is contracted
    mul, floor, rint, copysign = device_functions(_cpu_common, ["mul", "floor", "rint", "copysign"]).values()
    mul32 = mul

else:
    from numba.cuda import libdevice

    @jit(device=True)
    def floor(t):
        """``floor`` of a float64 as a float64 (the CPU's ``_common.floor``; NumPy's ufuncs do not
        compile for CUDA)."""
        return libdevice.floor(t)

    @jit(device=True)
    def rint(t):
        """float64 ``t`` rounded to an integer value, half to even (the CPU's ``_common.rint``)."""
        return libdevice.rint(t)

    @jit(device=True)
    def copysign(a, b):
        """``|a|`` with ``b``'s sign, float64 (the CPU's ``_common.copysign``)."""
        return libdevice.copysign(a, b)

    @jit(device=True)
    def mul(a, b):
        """float64 ``a * b`` rounded on its own: NVVM contracts ``s + a * b`` into one fused
        multiply-add by default, which rounds once where the CPU rounds twice."""
        return libdevice.dmul_rn(a, b)

    @jit(device=True)
    def mul32(a, b):
        """float32 ``a * b`` rounded on its own (see :func:`mul`)."""
        return libdevice.fmul_rn(a, b)


# ---------------------------------------------------------------------------- host arrays
def dev(a):
    """``a`` where a kernel reads it: itself when it is a device array, else the host array
    (tables, offsets, windows, factors) moved in by one host-to-device copy.  Never copied
    back, so a read-only host array is fine (Numba's own transfer of a host argument copies
    it back).  :func:`codec.device.to_device` is this function (the kernels never import
    ``codec.device``: it imports them)."""
    if on_device(a):
        if aligned(a):
            return a
        d = numba_cuda().device_array(a.shape, a.dtype)  # a misaligned view of a device frame: its bytes, aligned
        d.reshape(d.size).view(np.uint8).copy_to_device(a.reshape(a.size).view(np.uint8))
        return d
    return numba_cuda().to_device(np.ascontiguousarray(a))


class Results:
    """The outputs of a twin call: a device array as it is, a host array (per-unit counts,
    maxima, norms: a few numbers per block of values, or codes a caller wants on the host)
    through a device buffer copied into it once the kernels ran (:meth:`done`).
    ``r = Results(); d = r(host_or_device, zeroed=False); ...; r.done()``."""

    def __init__(self):
        self._back = []

    def __call__(self, a, zeroed: bool = False):
        if on_device(a) and aligned(a):
            if zeroed and a.size:
                zero[launch(a.size)](a.reshape(a.size))
            return a
        d = cuda.device_array(a.shape, a.dtype)
        if zeroed and a.size:
            zero[launch(a.size)](d.reshape(d.size))
        self._back.append((d, a))
        return d

    def done(self) -> None:
        for d, a in self._back:
            if not a.size:
                continue
            if on_device(a):  # a device view on no multiple of its item size (a section of a device frame): its bytes
                a.reshape(a.size).view(np.uint8).copy_to_device(d.reshape(d.size).view(np.uint8))
            else:
                d.copy_to_host(a)
        self._back.clear()


#: the most host tables :func:`constant` keeps on the device, per context
CONSTANTS = 64


def constant(a):
    """Small host array ``a`` (a quantizer's lookup table: the same few hundred bytes every
    call) on the device, moved once per context and content and kept (the :data:`CONSTANTS`
    latest): a decode then moves its codes, not its tables.  A device array is itself."""
    if on_device(a):
        return a
    a = np.ascontiguousarray(a)
    kept = per_context("constants", dict)
    key = (a.dtype.str, a.shape, a.tobytes())
    got = kept.get(key)
    if got is None:
        if len(kept) >= CONSTANTS:
            kept.pop(next(iter(kept)))
        got = kept[key] = numba_cuda().to_device(a)
    return got


def address(a) -> int:
    """The device address of device array ``a``'s first element (the simulator's: a host address)."""
    return a._ary.__array_interface__["data"][0] if hasattr(a, "_ary") else a.__cuda_array_interface__["data"][0]


def aligned(a) -> bool:
    """Whether device array ``a`` starts on a multiple of its item size: a section of a device
    frame may start at any byte, and a kernel's wider stores and loads need their alignment
    (:class:`Results` writes a misaligned output through an aligned buffer; a misaligned input
    is read through :func:`dev`'s aligned copy)."""
    return not a.size or address(a) % np.dtype(a.dtype).itemsize == 0


#: the segment ``t`` with ``starts[t] <= i < starts[t+1]``: the CPU's ``_common.owner`` (a
#: binary search), compiled as a device function
owner = device_functions(_cpu_common, ["owner"])["owner"]


@jit(device=True)
def block_max(v, tmp):
    """The largest ``v`` (uint64) over the block's threads, every thread calling it and getting
    the answer: a tree in shared ``tmp`` (``blockDim.x`` uint64 values)."""
    t = cuda.threadIdx.x
    tmp[t] = v
    cuda.syncthreads()
    off = 1
    while off < cuda.blockDim.x:
        if t % (2 * off) == 0 and t + off < cuda.blockDim.x:
            tmp[t] = max(tmp[t], tmp[t + off])
        cuda.syncthreads()
        off *= 2
    m = tmp[0]
    cuda.syncthreads()
    return m


#: the longest unit (a bucket, a window) a kernel gives one thread rather than a block: a
#: block's barriers cost more than a short unit's loop
SERIAL_UNIT = 64


def per_unit(units: int) -> tuple[int, int]:
    """``(blocks, threads)`` of a launch of one block per work unit (a bucket, a chunk, a
    window piece): at most ``MAX_BLOCKS`` blocks, each striding over the units by the grid."""
    return min(max(1, units), MAX_BLOCKS), THREADS


def nothing(dtype):
    """An empty device array of ``dtype`` (kept per context): what a kernel gets for an
    optional array it was not given (``r``, ``acc``, ``sub``), tested by ``.size``."""
    return per_context(("nothing", np.dtype(dtype).str), lambda: cuda.device_array(0, dtype))


def check_width(width: int) -> None:
    """CodecValueError unless ``width`` column lanes fit the lane buffers (``MAX_WIDTH``)."""
    if not 1 <= width <= MAX_WIDTH:
        from codec.errors import CodecValueError

        raise CodecValueError(f"width: {width} lanes, the CUDA kernels take 1 to {MAX_WIDTH}")


#: the twins of the CPU ``_common``'s float rules (and its ``mul``: a product rounded on its
#: own), for ``device_functions(..., extra=MATH)``
MATH = {"floor": floor, "rint": rint, "copysign": copysign, "mul": mul}


def views_at(addrs, starts, like):
    """Per tensor ``t`` of a segmented call, ``(t, lo, hi, device array of like's dtype at
    addrs[t])`` (tensors of no values left out); the simulator cannot view an address (CodecTypeError)."""
    view = getattr(numba_cuda(), "from_cuda_array_interface", None)
    if view is None:
        from codec.errors import CodecTypeError

        raise CodecTypeError("addrs: this CUDA target (the simulator) cannot view device memory by address")
    for t in range(len(addrs)):
        lo, hi = int(starts[t]), int(starts[t + 1])
        if hi > lo:
            face = {"shape": (hi - lo,), "typestr": np.dtype(like.dtype).str, "data": (int(addrs[t]), False), "version": 3, "strides": None}
            yield t, lo, hi, view(face, owner=like, sync=False)
