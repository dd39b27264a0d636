"""The DDP communication hook (transport/ddp.py) in P gloo processes, launched by
tests/test_ddp.py (each process: ``RANK``, ``WORLD_SIZE``, ``MASTER_PORT`` in its environment):

    python tests/torch_ddp.py CASE [CASE ...]

Prints ``OK <case> rank r/p`` or ``FAIL <case> rank r/p: ...`` lines, as the MPI harness does.
Cases:

* ``hook``: for several specs (a sparsifier, a quantizer, fp16, PowerSGD, gTop-k, none), three
  steps of a small model whose DDP buckets hold several parameters: the hook's averaged
  gradients are bit for bit an ``Allreducer`` of the same raw gradients keyed by name (the
  transport the MPI tests check against their references), identical on every rank; for
  top-k at the first step, the mean of every rank's decoded frame, formed here; fp16 (summed
  in fp16 by all_reduce, as PyTorch's fp16 hook) within fp16's rounding of the mean.
* ``warmup``: ``start_iter`` steps are plain DDP averages.
* ``train``: 60 steps of a regression with top-k(10%) + error feedback: the loss halves.
* ``checkpoint``: model, optimizer and hook state saved after 2 steps (the state pickled) and
  restored into new objects: the next steps' gradients are those of the run that went on.
* ``hook`` and ``train`` also run on NCCL (``GRADCODEC_DDP_BACKEND=nccl``, models on each
  rank's GPU): the hook's device path against an ``Allreducer`` of host copies over a gloo
  group beside it.
* ``save`` then ``restore`` (two launches, ``GRADCODEC_CKPT_DIR``): the same across processes:
  ``torch.save`` of the checkpoint in one job, ``torch.load`` in a new one.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import codec
from transport import Allreducer
from transport.ddp import GradcodecState, gradcodec_hook

SPECS = ("topk(ratio=0.1)", "minmax(bits=4,rounding=nearest)", "fp16", "powersgd(rank=2,min_compression_rate=0)", "gtopk(ratio=0.2)", "none")


#: where the models live: the CPU on gloo; on NCCL (GRADCODEC_DDP_BACKEND=nccl) this rank's GPU
DEVICE = torch.device("cpu")
#: the group the references reduce host copies over (the default group on gloo, a gloo group beside NCCL)
HOST_GROUP = None


def model_of(seed: int = 0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return net.to(DEVICE)


def ddp_of(model):
    ids = None if DEVICE.type == "cpu" else [DEVICE]
    return DDP(model, bucket_cap_mb=0.0005, device_ids=ids)  # (buckets of a few hundred bytes: several buckets, several parameters each)


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 12, generator=g)
    return x.to(DEVICE), (x[:, :3] * 2.0 - x[:, 3:6]).to(DEVICE)


def grads_of(model) -> dict:
    """Host copies of ``model``'s gradients."""
    return {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}


class Case:
    def __init__(self, name):
        self.name, self.rank, self.size = name, dist.get_rank(), dist.get_world_size()
        self.failures = []

    def fail(self, msg):
        self.failures.append(msg)

    def same(self, got: dict, want: dict, what: str):
        for k in want:
            a, b = got[k].numpy(), want[k].numpy() if isinstance(want[k], torch.Tensor) else want[k]
            if a.shape != b.shape or a.tobytes() != np.ascontiguousarray(b, a.dtype).tobytes():
                self.fail(f"{what}: {k!r} differs (max |diff| {np.abs(a.astype(np.float64) - b.astype(np.float64)).max():.3g})")

    def agree(self, got: dict, what: str):
        every = [None] * self.size
        dist.all_gather_object(every, {k: v.numpy().tobytes() for k, v in got.items()})
        if any(e != every[0] for e in every):
            self.fail(f"{what}: the ranks' gradients differ")


def step(ddp, rank, i):
    ddp.zero_grad(set_to_none=True)
    x, y = batch(rank, i)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    return float(loss.detach())


def case_hook(ck):
    for spec in SPECS:
        model = model_of()
        ddp = ddp_of(model)
        ddp.register_comm_hook(GradcodecState(None, spec, model=model), gradcodec_hook)
        plain = model_of()  # the same weights, no DDP: this rank's raw gradients
        red = Allreducer(spec, comm=HOST_GROUP)  # (host copies: on NCCL, the device path against the host's)
        for i in range(3):
            with torch.no_grad():
                for p, q in zip(plain.parameters(), model.parameters()):
                    p.copy_(q)
            plain.zero_grad(set_to_none=True)
            x, y = batch(ck.rank, i)
            torch.nn.functional.mse_loss(plain(x), y).backward()
            raw = grads_of(plain)
            step(ddp, ck.rank, i)
            got = grads_of(model)
            want = red.reduce({k: v.clone() for k, v in raw.items()})
            if spec == "fp16":  # summed as it is (fp16_compress_hook's way); at the first step, before any residual, within fp16's rounding of the mean
                every = [None] * ck.size
                dist.all_gather_object(every, {k: v.numpy() for k, v in raw.items()})
                for k in raw if i == 0 else ():
                    mean = sum(e[k].astype(np.float64) for e in every) / ck.size
                    if not np.allclose(got[k].numpy(), mean, rtol=4e-3, atol=1e-4 * np.abs(mean).max() + 1e-7):
                        ck.fail(f"fp16 step {i}: {k!r} beyond fp16's rounding of the mean")
            elif ck.size > 2 and spec.split("(")[0] in ("none", "powersgd"):  # gloo's dense sums: their order varies with the buffer beyond 2 ranks
                for k in want:
                    if not np.allclose(got[k].numpy(), want[k], rtol=1e-5, atol=1e-7):
                        ck.fail(f"{spec} step {i}: the hook against Allreducer: {k!r} beyond rounding")
            else:
                ck.same(got, want, f"{spec} step {i}: the hook against Allreducer")
            ck.agree(got, f"{spec} step {i}")
            if i == 0 and spec == "topk(ratio=0.1)":  # formed here: the mean of every rank's decoded frame
                every = [None] * ck.size
                dist.all_gather_object(every, {k: v.numpy() for k, v in raw.items()})
                c = codec.get_codec(spec)
                for k in raw:
                    acc = np.zeros(raw[k].shape, np.float32)
                    for r in range(ck.size):
                        c.decode_add(c.encode(every[r][k]), acc)
                    ck.same({k: got[k]}, {k: acc / np.float32(ck.size)}, f"{spec}: the mean of the decoded frames")
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.05 * p.grad)


def case_warmup(ck):
    model = model_of()
    ddp = ddp_of(model)
    ddp.register_comm_hook(GradcodecState(None, "topk(ratio=0.05)", start_iter=2), gradcodec_hook)
    ref = ddp_of(model_of())  # plain DDP
    for i in range(3):
        step(ddp, ck.rank, i)
        step(ref, ck.rank, i)
        got, want = grads_of(model), grads_of(ref.module)
        dense = all(got[k].numpy().tobytes() == want[k].numpy().tobytes() for k in got)
        if (i < 2) != dense:
            ck.fail(f"step {i}: {'not ' if i < 2 else ''}the plain DDP average with start_iter=2")


def case_train(ck):
    model = model_of(3)
    ddp = ddp_of(model)
    ddp.register_comm_hook(GradcodecState(None, "topk(ratio=0.1)", model=model), gradcodec_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    losses = []
    for i in range(60):
        losses.append(step(ddp, ck.rank, i % 4))
        opt.step()
    first, last = np.mean(losses[:4]), np.mean(losses[-4:])
    if not last < 0.5 * first:
        ck.fail(f"the loss did not fall: {first:.4f} -> {last:.4f}")


def case_checkpoint(ck):
    for spec in ("topk(ratio=0.1)+fp16", "fp16"):  # (framed by the Allreducer; summed as it is, its residuals the state's own)
        _checkpoint(ck, spec)


def _checkpoint(ck, spec):
    def build():
        model = model_of(4)
        ddp = ddp_of(model)
        return model, ddp, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    model, ddp, opt = build()
    state = GradcodecState(None, spec, model=model)
    ddp.register_comm_hook(state, gradcodec_hook)
    for i in range(2):
        step(ddp, ck.rank, i)
        opt.step()
    saved = pickle.dumps({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state})
    went_on = []
    for i in range(2, 4):
        step(ddp, ck.rank, i)
        went_on.append(grads_of(model))
        opt.step()
    model2, ddp2, opt2 = build()
    box = pickle.loads(saved)
    model2.load_state_dict(box["model"])
    opt2.load_state_dict(box["opt"])
    ddp2.register_comm_hook(box["hook"].bind(model2), gradcodec_hook)
    if box["hook"].iter != 2:
        ck.fail(f"{spec}: the restored state is at iteration {box['hook'].iter}, not 2")
    for j, i in enumerate(range(2, 4)):
        step(ddp2, ck.rank, i)
        ck.same(grads_of(model2), went_on[j], f"{spec}: step {i} after the restore")
        opt2.step()


def _ckpt(rank: int) -> str:
    return os.path.join(os.environ["GRADCODEC_CKPT_DIR"], f"ckpt.{rank}.pt")


def case_save(ck):
    """The first half of a restore in new processes: 2 steps, then model, optimizer and hook
    state saved (``torch.save``, one file per rank) with the gradients of the 2 steps that
    follow in this run, for ``restore`` to match."""
    model = model_of(5)
    ddp = ddp_of(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = GradcodecState(None, "topk(ratio=0.1)+fp16", model=model)
    ddp.register_comm_hook(state, gradcodec_hook)
    for i in range(2):
        step(ddp, ck.rank, i)
        opt.step()
    box = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state}
    torch.save(box, _ckpt(ck.rank) + ".tmp")
    went_on = []
    for i in range(2, 4):
        step(ddp, ck.rank, i)
        went_on.append({k: v.numpy() for k, v in grads_of(model).items()})
        opt.step()
    torch.save(went_on, _ckpt(ck.rank) + ".grads")
    os.replace(_ckpt(ck.rank) + ".tmp", _ckpt(ck.rank))


def case_restore(ck):
    """The second half, in new processes: the checkpoint loaded into a new model, optimizer
    and DDP, the hook's state bound to the model: the next 2 steps' gradients are the saved
    run's, bit for bit."""
    box = torch.load(_ckpt(ck.rank), weights_only=False)
    went_on = torch.load(_ckpt(ck.rank) + ".grads", weights_only=False)
    model = model_of(6)  # (other weights: the checkpoint's replace them)
    model.load_state_dict(box["model"])
    ddp = ddp_of(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt.load_state_dict(box["opt"])
    ddp.register_comm_hook(box["hook"].bind(model), gradcodec_hook)
    for j, i in enumerate(range(2, 4)):
        step(ddp, ck.rank, i)
        ck.same(grads_of(model), went_on[j], f"step {i} in new processes")
        opt.step()


CASES = {"hook": case_hook, "warmup": case_warmup, "train": case_train, "checkpoint": case_checkpoint, "save": case_save, "restore": case_restore}


def main(argv) -> int:
    global DEVICE, HOST_GROUP
    backend = os.environ.get("GRADCODEC_DDP_BACKEND", "gloo")
    rank = int(os.environ["RANK"])
    if backend == "nccl":
        DEVICE = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    rank, size = dist.get_rank(), dist.get_world_size()
    HOST_GROUP = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
    bad = 0
    for name in argv or list(CASES):
        ck = Case(name)
        try:
            CASES[name](ck)
        except Exception:
            print(f"ERROR {name} rank {rank}/{size}:\n{traceback.format_exc()}", flush=True)
            return 1
        for f in ck.failures[:20]:
            print(f"FAIL {name} rank {rank}/{size}: {f}", flush=True)
        if not ck.failures:
            print(f"OK {name} rank {rank}/{size}", flush=True)
        bad += len(ck.failures)
    _close()
    return 1 if bad else 0


def _close() -> None:
    """Leave the group so that no rank tears gloo down under another: every rank past its
    last collective (a barrier), the cases' DDP objects (reference cycles that hold the
    process group and its worker threads) freed while the interpreter is whole, then the
    group destroyed. Without the first two, one launch in CI aborted after its OK line
    ("terminate called without an active exception", exit -6) as the interpreter finalized."""
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
