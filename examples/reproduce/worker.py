"""One model's training runs, data-parallel over the ranks of an MPI job through gradcodec's
transport (``transport.Allreducer``): every configuration of ``--configs`` for every seed of
``--seeds``, in one job.  scripts/reproduce.py launches it (docs/evidence.md):

    mpiexec -n 4 python -m mpi4py examples/reproduce/worker.py --model cnn --steps 300 \
        --seeds 0,1,2 --configs dense,topk-1%,... --out results/cnn.json

Each step: every rank computes the gradients of its shard of the global batch, the
Allreducer (or, with ``--transport ddp``, DistributedDataParallel on gloo with gradcodec's
communication hook) averages them over the ranks (compressed frames on the wire, error feedback on),
written into the gradients in place, and the optimizer steps (SGD, momentum 0.9; for DGC's
recipe the momentum is the transport's momentum correction instead).  Rank 0 writes, per
run: the test metric every ``--eval-every`` steps and at the end, the training loss (the
ranks' mean) every 10 steps, the bytes each rank sent a step (the frames, headers included:
``Allreducer.stats.bytes_sent``) and the frame bytes per layer type, and the time a step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import MODELS, Data, factorize_from, layer_type, make, metric  # noqa: E402

from transport import Allreducer  # noqa: E402

#: the configurations: (spec, options); "momentum" is DGC's momentum correction (the
#: optimizer then has none), "factorized" Pufferfish's low-rank model (its gradients dense)
CONFIGS = {
    "dense": ("none", {}),
    "topk-1%": ("topk(ratio=0.01)", {}),
    "topk-0.1%": ("topk(ratio=0.001)", {}),
    "dgc-0.1%": ("dgc(ratio=warmup(0.25,0.001,steps={warm},every={every}))", {"momentum": 0.9}),
    "gaussiank-1%": ("gaussiank(ratio=0.01)", {}),
    "adacomp": ("adacomp", {}),
    "fft-0.99": ("fft(theta=0.99)", {}),
    "fft-0.99-diminishing": ("fft(theta=exp(0.99,0.8,steps={steps}))", {}),
    "rangefloat-8": ("rangefloat(bits=8)", {}),
    "powersgd-2": ("powersgd(rank=2)", {}),
    "powersgd-2-warm": ("powersgd(rank=2)", {"dense_first": 0.1}),  # (the paper's dense warm-up: the first 10% of the steps uncompressed)
    "qsgd": ("qsgd", {}),
    "terngrad": ("terngrad", {}),
    "pufferfish": ("none", {"factorized": True}),
    "pufferfish-warm": ("none", {"factorized": True, "vanilla_first": 0.1}),  # (Pufferfish's recipe: the full model first, then its SVD)
    "fp16": ("fp16", {}),
    "efsign": ("efsign", {}),
    "randomk-1%": ("randomk(ratio=0.01)", {}),
    "minmax-4": ("minmax(bits=4)", {}),
}


def process_group(comm) -> None:
    """A gloo process group of the MPI job's ranks (rank 0 picks a free port and tells the
    others), for ``--transport ddp``."""
    import socket

    import torch.distributed as dist

    port = None
    if comm.rank == 0:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size)


class Hooked:
    """``--transport ddp``: the model in DistributedDataParallel with gradcodec's
    communication hook (transport/ddp.py), its bytes read off the hook's reducer."""

    def __init__(self, model, spec: str):
        from torch.nn.parallel import DistributedDataParallel as DDP

        from transport.ddp import GradcodecState, gradcodec_hook

        self.ddp = DDP(model)
        self.state = GradcodecState(None, spec, model=model)
        self.ddp.register_comm_hook(self.state, gradcodec_hook)
        self.dense = sum(p.numel() for p in model.parameters())
        self.before = 0

    def sent(self) -> int:
        """The bytes this rank sent in the last step."""
        if self.state.summed is not None:  # fp16/bf16 alone: one all_reduce of 2-byte codes
            return 2 * self.dense
        now = self.state.reducer.totals.bytes_sent
        out, self.before = now - self.before, now
        return out


def run(comm, model_name: str, config: str, seed: int, steps: int, eval_every: int, transport: str = "mpi") -> dict:
    spec, opts = CONFIGS[config]
    if transport == "ddp" and (opts.get("momentum") or opts.get("vanilla_first") or opts.get("dense_first")):
        raise SystemExit(f"{config}: its recipe (momentum correction, a warm-up) runs through the Allreducer here, not the DDP hook")
    every = max(1, steps // 16)
    spec = spec.format(steps=steps, warm=4 * every, every=every)
    torch.manual_seed(seed)
    data = Data(model_name, comm.rank, comm.size, seed)
    vanilla = int(opts.get("vanilla_first", 0.0) * steps)  # steps of the full model before Pufferfish factorizes it
    model = make(model_name, factorized=opts.get("factorized", False) and not vanilla, vocab=getattr(data, "vocab", 0))
    kinds = layer_type(model)
    names = [n for n, _ in model.named_parameters()]
    hooked = Hooked(model, spec) if transport == "ddp" else None
    reducer = None if hooked else Allreducer(spec, comm, momentum=opts.get("momentum", 0.0))
    warm = int(opts.get("dense_first", 0.0) * steps)  # steps reduced dense before the codec takes over
    dense = Allreducer("none", comm) if warm else None
    net = hooked.ddp if hooked else model
    momentum = 0.0 if opts.get("momentum") else 0.9
    opt = torch.optim.SGD(model.parameters(), lr=MODELS[model_name]["lr"], momentum=momentum)
    lossf = torch.nn.functional.cross_entropy
    curve, evals, sent, times, kind_bytes = [], [], [], [], {}
    for step in range(steps):
        if vanilla and step == vanilla:
            model = factorize_from(model, model_name)
            kinds, names = layer_type(model), [n for n, _ in model.named_parameters()]
            opt = torch.optim.SGD(model.parameters(), lr=MODELS[model_name]["lr"], momentum=momentum)
            net = model
        t0 = time.perf_counter()
        x, y = data.batch()
        opt.zero_grad(set_to_none=False)
        out = net(x)
        loss = lossf(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()  # (under DDP the hook reduces the gradients here)
        if hooked and model_name == "lstm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # (the averaged gradient: clipped after the hook)
        if reducer is not None:
            if model_name == "lstm":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # (each rank its own gradient: the usual LSTM recipe)
            grads = {n: p.grad for n, p in model.named_parameters()}
            now = dense if step < warm else reducer  # (the warm-up's dense steps, then the codec)
            now.reduce(grads, out=grads)
        opt.step()
        times.append(time.perf_counter() - t0)
        if hooked:
            sent.append(hooked.sent())
        else:
            st = now.stats
            sent.append(st.bytes_sent)
            for n in names:
                k = kinds[n]
                kind_bytes.setdefault(k, [0, 0])
                kind_bytes[k][0] += st.tensors[n]["wire_bytes"]
                kind_bytes[k][1] += st.tensors[n]["dense_bytes"]
        if step % 10 == 0 or step == steps - 1:
            curve.append((step, comm.allreduce(float(loss.detach())) / comm.size))
        if eval_every and (step + 1) % eval_every == 0 and step != steps - 1:
            evals.append((step + 1, metric(model_name, model, data)))
    evals.append((steps, metric(model_name, model, data)))
    return {
        "model": model_name, "metric_name": MODELS[model_name]["metric"], "config": config, "transport": transport,
        "spec": hooked.state.spec if hooked else reducer.spec, "momentum": opts.get("momentum", 0.0), "dense_first": warm, "vanilla_first": vanilla, "seed": seed, "steps": steps,
        "ranks": comm.size, "params": sum(p.numel() for p in model.parameters()),
        "metric": evals[-1][1], "evals": evals, "loss": curve,
        "bytes_sent_per_step": float(np.mean(sent)), "dense_bytes_per_step": float(sum(p.numel() * 4 for p in model.parameters())),
        "bytes_by_layer_type": {k: {"wire": w / steps, "dense": d / steps} for k, (w, d) in kind_bytes.items()},
        "step_ms": float(np.median(times) * 1e3),
        "reduce_ms": _reduce_ms(reducer if reducer is not None else hooked.state._reducer, steps),
    }


def _reduce_ms(reducer, steps: int) -> float:
    """The reducer's encode, communication and decode time a step (nan without a reducer:
    the hook's fp16/bf16 cast path)."""
    if reducer is None:
        return float("nan")
    t = reducer.totals
    return float((t.encode_s + t.communicate_s + t.decode_s) / steps * 1e3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: at the end only)")
    ap.add_argument("--transport", choices=["mpi", "ddp"], default="mpi",
                    help="mpi: transport.Allreducer over MPI; ddp: DistributedDataParallel on gloo with gradcodec's hook")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    if args.transport == "ddp":
        process_group(comm)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for config in args.configs.split(","):
            t = time.perf_counter()
            r = run(comm, args.model, config, seed, args.steps, args.eval_every, args.transport)
            r["seconds"] = time.perf_counter() - t
            results.append(r)
            if comm.rank == 0:
                print(f"{args.model} {config:22s} seed {seed}: {MODELS[args.model]['metric']} {r['metric']:.4f}, "
                      f"{r['bytes_sent_per_step'] / 1e3:.1f} kB/step/rank, {r['step_ms']:.1f} ms/step, {r['seconds']:.0f} s", flush=True)
                with open(args.out, "w") as f:  # (after every run: a long job's results so far survive it)
                    json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
