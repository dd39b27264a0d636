"""How many bytes a device encode copies to the host, against its frame's size, counted in
Numba's CUDA simulator (so it runs on any machine):

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/cuda_bytes.py ["spec" ...]

One tensor of 20,000 float32 values (``encode``), then a run of five (3,000, 500, 10,000, 70
and 6,400 values: ``encode_many``, the segmented selections).  Every device-to-host copy is
counted (the simulator's ``copy_to_host``); a frame's own bytes are among them.  The default
specs are the sparsifiers and fft, whose selections once sent their candidates back.  The
simulator's launch shapes are shrunk as the tests shrink them (tests/cuda/conftest.py), which
changes no count.
"""
import sys

import numpy as np
from numba import cuda

import codec
from codec.kernels.cuda import _common

_common.THREADS, _common.MAX_BLOCKS, _common.SCAN_BLOCK, _common.SCAN_ITEMS = 32, 4, 4, 128
SPECS = ("topk(ratio=0.01)", "topk(ratio=0.01)+fp16", "gaussiank(ratio=0.01)", "dgc(ratio=0.01)", "threshold(value=2.5)", "adacomp",
         "randomk(ratio=0.01)", "randomk(ratio=0.01,scale=true)", "fft(theta=0.99)", "fft(theta=0.99,keep=global)")
RUN = (3000, 500, 10000, 70, 6400)


def main(specs) -> None:
    rng = np.random.default_rng(0)
    one = cuda.to_device(rng.standard_normal(20000).astype(np.float32))
    run = [cuda.to_device(rng.standard_normal(n).astype(np.float32)) for n in RUN]
    copied = []
    real = type(one).copy_to_host
    type(one).copy_to_host = lambda self, *a, **k: copied.append(self.nbytes) or real(self, *a, **k)
    print("| codec | call | frame bytes | copied to the host |")
    print("|---|---|---:|---:|")
    for spec in specs:
        c = codec.get_codec(spec)
        for call, make in (("encode", lambda: c.encode(one)), ("encode_many (5 tensors)", lambda: c.encode_many(run))):
            copied.clear()
            frame = make()
            print(f"| `{spec}` | {call} | {len(frame):,} | {sum(copied):,} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or SPECS)
