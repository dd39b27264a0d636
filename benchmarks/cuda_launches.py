"""How many kernel launches and copies each many-tensor call makes on the device (launch
overhead is what a whole-model step pays per launch: about 0.04-0.05 ms each with Numba on an
H200, and a copy call costs about as much), counted in Numba's CUDA simulator, so it runs on
any machine:

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/cuda_launches.py ["spec" ...]

(the given codecs only; all of them take over an hour in the simulator: a quantizer's
many-tensor calls are thread-per-value kernels, about a minute a call there)

Eight float32 tensors of 20 to 1,200 values (one CUDA chunk each), as separate device arrays
and as views of one buffer (a framework's gradient bucket: ``codec.device.span``).  Error
feedback is counted at its third step (its steady state: a run's residuals and spares are one
buffer each from then on).  "launches" counts kernels; "copies" counts device-to-device,
host-to-device and device-to-host copies.  The simulator's launch shapes are shrunk as the
tests shrink them (tests/cuda/conftest.py), which changes no count.  A second table: one
sparse frame decoded into a device array, its index section read on the host and on the
device (the ``index`` twin), with the bytes copied to the device.
"""
import collections
import sys

import numpy as np
from numba import cuda
from numba.cuda.simulator import kernel
from numba.cuda.simulator.cudadrv import devicearray

import codec
from codec.kernels.cuda import _common

_common.THREADS, _common.MAX_BLOCKS, _common.SCAN_BLOCK, _common.SCAN_ITEMS = 32, 1, 4, 128
LAUNCHES, COPIES = collections.Counter(), collections.Counter()


def counted(counter, name, real):
    def wrapper(*args, **kwargs):
        counter[name] += 1
        return real(*args, **kwargs)

    return wrapper


kernel.FakeCUDAKernel.__getitem__ = (lambda real: lambda self, cfg: (LAUNCHES.update([self.fn.__name__]), real(self, cfg))[1])(kernel.FakeCUDAKernel.__getitem__)
devicearray.FakeCUDAArray.copy_to_device = counted(COPIES, "to device", devicearray.FakeCUDAArray.copy_to_device)
devicearray.FakeCUDAArray.copy_to_host = counted(COPIES, "to host", devicearray.FakeCUDAArray.copy_to_host)
cuda.to_device = counted(COPIES, "to device", cuda.to_device)


def count(f):
    LAUNCHES.clear()
    COPIES.clear()
    f()
    return sum(LAUNCHES.values()), sum(COPIES.values())


def main():
    rng = np.random.default_rng(0)
    sizes = (300, 40, 900, 20, 500, 1200, 60, 800)
    host = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    apart = [cuda.to_device(t) for t in host]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    bucket = cuda.to_device(np.concatenate(host))
    views = [bucket[a:b] for a, b in zip(starts, starts[1:])]
    print("| codec | tensors | encode_many | joint | ErrorFeedback.encode_many (3rd step) | with momentum=0.9 | decode_many(out=) | decode_add_many |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    every = ["fp16", "fp16+zstd", "fp8", "rangefloat(bits=8)", "minmax(bits=4)", "qsgd", "terngrad", "sign", "topk(ratio=0.05)", "dgc(ratio=0.05)", "gaussiank(ratio=0.05)", "adacomp", "randomk(ratio=0.05)", "powersgd", "fft(block=64)"]
    for spec in sys.argv[1:] or every:
        c = codec.get_codec(spec)
        frame = c.encode_many(host)
        for kind, ts in (("apart", apart), ("bucket", views)):
            ef, efm = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec, momentum=0.9)
            for _ in range(2):
                ef.encode_many(ts)
                efm.encode_many(ts)
            cells = [count(lambda: c.encode_many(ts)), count(lambda: c.encode_many(ts, joint=True)), count(lambda: ef.encode_many(ts)),
                     count(lambda: efm.encode_many(ts)), count(lambda: codec.decode_many(frame, out=ts)), count(lambda: codec.decode_add_many(frame, ts))]
            print(f"| {spec} | {kind} | " + " | ".join(f"{n} + {m}" for n, m in cells) + " |")
    one_frame()


def one_frame():
    """One sparse frame of 20,000 float32 decoded into a device array, its index section read
    on the host (the default below ``codec.pack.DEVICE_SECTION`` bytes) and on the device
    (the threshold set to 0): launches, copies and the bytes copied to the device."""
    import codec.pack

    moved = collections.Counter()
    real = devicearray.FakeCUDAArray.copy_to_device

    def to_device(self, ary, *args, **kwargs):
        moved["bytes"] += getattr(ary, "nbytes", 0)
        return real(self, ary, *args, **kwargs)

    devicearray.FakeCUDAArray.copy_to_device = to_device  # (real: the counted copy)
    real_to = cuda.to_device
    cuda.to_device = lambda a, *r, **k: (moved.update(bytes=np.asarray(a).nbytes), real_to(a, *r, **k))[1]
    x = (np.random.default_rng(0).standard_t(2, 20000) * 1e-3).astype(np.float32)
    default = codec.pack.DEVICE_SECTION
    print()
    print("| codec | call | index section read on the host | on the device |")
    print("|---|---|---:|---:|")
    for spec in ("topk(ratio=0.01)", "threshold(value=0.001)", "dgc(ratio=0.01)+fp16"):
        c = codec.get_codec(spec)
        f = c.encode(x)
        for what, call in (("decode(out=)", lambda o: c.decode(f, out=o)), ("decode_add", lambda o: c.decode_add(f, o))):
            cells = []
            for limit in (default, 0):
                codec.pack.DEVICE_SECTION = limit
                o = real_to(np.zeros(x.size, np.float32))
                call(o)
                moved.clear()
                n, m = count(lambda: call(o))
                cells.append(f"{n} + {m}, {moved['bytes']:,} B")
            codec.pack.DEVICE_SECTION = default
            print(f"| {spec} | {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
