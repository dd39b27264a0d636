"""The smallest complete data-parallel training loop with a compressed allreduce.

    pip install -e ".[mpi]"
    mpiexec -n 4 python -m mpi4py examples/allreduce_mpi.py [SPEC]      # default topk(ratio=0.01)

Every rank holds its own shard of a synthetic regression problem (a two-layer network in plain
NumPy), computes its gradients, and ``Allreducer.reduce`` returns the average over ranks,
identical on every rank, so the replicas stay in sync.  Error feedback (on by default) sends
what top-k dropped in later steps.  ``python -m mpi4py`` makes an exception on one rank abort
the whole job instead of leaving the others waiting.
"""

import sys

import numpy as np
from mpi4py import MPI

from transport import Allreducer

comm = MPI.COMM_WORLD
spec = sys.argv[1] if len(sys.argv) > 1 else "topk(ratio=0.01)"

# the same model on every rank (same seed), a different data shard per rank
model_rng = np.random.default_rng(0)
params = {
    "w1": (model_rng.standard_normal((64, 256)) / 8).astype(np.float32),
    "w2": (model_rng.standard_normal((256, 1)) / 16).astype(np.float32),
}
teacher = np.random.default_rng(1).standard_normal((64, 1)).astype(np.float32)
shard = np.random.default_rng(100 + comm.rank).standard_normal((512, 64)).astype(np.float32)
target = np.tanh(shard @ teacher)

reducer = Allreducer(spec, comm)  # average=True, error_feedback=True
lr = 0.02
for step in range(201):
    h = np.maximum(shard @ params["w1"], 0)  # forward
    err = h @ params["w2"] - target
    loss = float(np.mean(err**2))
    d_out = 2 * err / err.size  # backward
    grads = {"w2": h.T @ d_out, "w1": shard.T @ ((d_out @ params["w2"].T) * (h > 0))}
    grads = reducer.reduce(grads)  # the average over ranks, compressed on the wire
    for k in params:
        params[k] -= lr * grads[k]
    mean_loss = comm.allreduce(loss) / comm.size
    if comm.rank == 0 and step % 50 == 0:
        s = reducer.stats
        print(f"step {step:3d}  loss {mean_loss:.4f}  sent {s.bytes_sent} B/rank (dense {sum(t['dense_bytes'] for t in s.tensors.values())} B)")
