"""How many kernel launches each many-tensor call makes on the device (launch overhead is what
a whole-model step pays per launch: about 0.04-0.05 ms each with Numba on an H200), counted
in Numba's CUDA simulator, so it runs on any machine:

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/cuda_launches.py

Eight float32 tensors of 20 to 1,200 values (one CUDA chunk each); the simulator's launch
shapes are shrunk as the tests shrink them (tests/cuda/conftest.py), which changes no count.
"""
import numpy as np, collections, codec
from numba import cuda
from codec.kernels.cuda import _common
_common.THREADS = 32
_common.MAX_BLOCKS = 1
_common.SCAN_BLOCK = 4
_common.SCAN_ITEMS = 128
import numba.cuda.simulator.kernel as K
N=collections.Counter()
orig=K.FakeCUDAKernel.__getitem__
def gi(self, cfg):
    N[self.fn.__name__] += 1
    return orig(self, cfg)
K.FakeCUDAKernel.__getitem__=gi
rng=np.random.default_rng(0)
T=[rng.standard_normal(n).astype(np.float32) for n in (300,40,900,20,500,1200,60,800)]
D=[cuda.to_device(t) for t in T]
for spec in ["fp16","topk(ratio=0.05)","dgc(ratio=0.05)","gaussiank(ratio=0.05)","adacomp","randomk(ratio=0.05)"]:
    c=codec.get_codec(spec)
    for what,f in (("encode_many",lambda: c.encode_many(D)),("encode_many joint",lambda: c.encode_many(D,joint=True)),("EF encode_many",lambda: codec.ErrorFeedback(spec).encode_many(D)),("decode_many out",lambda: codec.decode_many(c.encode_many(T),out=D))):
        N.clear(); f(); print(f"{spec:22s} {what:18s} launches={sum(N.values()):3d} {dict(N)}")
