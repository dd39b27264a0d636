"""gradcodec's DDP hook against PyTorch's own hooks on a ResNet-18 (11.2M parameters), gloo:

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/bench_ddp.py [--markdown]

Per configuration, a fresh DDP of the same weights, in one bucket (``bucket_cap_mb=64``:
with DDP's default two buckets, powerSGD_hook's allreduces, chained in callbacks, were issued
in different orders on the two ranks and gloo aborted); a step is one forward and backward of a
small batch (2 CIFAR-sized images, so the step is mostly the gradients' communication), the
hook included, timed on every rank and the slowest taken, median over ``--steps`` after
``--warmup`` steps (PowerSGD's warm-up iterations among them).  Columns: ms a step; the
ratio of the dense allreduce step (DDP's default, no hook) measured in the same run to it;
the bytes a rank sends a step (DDP's dense float32 buckets; fp16_compress_hook half of them;
powerSGD_hook its P and Q, counted from the shapes; gradcodec's fp16, cast and summed as it
is, half of them too; the others' from the reducer's ``Stats``, headers included) and, for
gradcodec's framed specs, its encode + decode seconds a step (``Stats``).  Needs torch (``pip install -e ".[torch]"``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from transport.ddp import GradcodecState, gradcodec_hook


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.short = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.short(x))


def resnet18(classes: int = 10):
    torch.manual_seed(0)
    layers, cin = [torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU()], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, classes)]
    return torch.nn.Sequential(*layers)


def psgd_bytes(model, rank: int) -> int:
    """powerSGD_hook's P and Q float32 bytes a step (matrices compressed as the hook does:
    every tensor of ndim > 1 viewed as n x m, when (n + m) r < n m; the rest dense)."""
    total = 0
    for p in model.parameters():
        if p.ndim > 1:
            n, m = p.shape[0], p.numel() // p.shape[0]
            r = min(rank, n, m)
            total += 4 * ((n + m) * r if (n + m) * r < n * m else n * m)
        else:
            total += 4 * p.numel()
    return total


def _timed(hook, spent: list):
    """``hook`` reporting into ``spent`` the seconds from its call to its future's completion."""

    def timed(state, bucket):
        t = time.perf_counter()

        def done(fut):
            spent.append(time.perf_counter() - t)
            return fut.value()

        return hook(state, bucket).then(done)

    return timed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
    dense = sum(p.numel() * 4 for p in resnet18().parameters())
    configs = [
        ("DDP default (allreduce, reference)", None, None, dense),
        ("torch fp16_compress_hook", None, default_hooks.fp16_compress_hook, dense // 2),
        ("torch powerSGD_hook rank 4", "psgd", powerSGD_hook.powerSGD_hook, None),
        ("gradcodec fp16", "fp16", gradcodec_hook, None),
        ("gradcodec powersgd(rank=4)", "powersgd(rank=4)", gradcodec_hook, None),
        ("gradcodec topk(ratio=0.01)+fp16", "topk(ratio=0.01)+fp16", gradcodec_hook, None),
    ]
    rows, base = [], None
    for label, spec, hook, sent in configs:
        model = resnet18()
        ddp = DDP(model, bucket_cap_mb=64)  # (DDP's default: PyTorch's allreduce_hook, here timed as the others)  # one bucket: powerSGD_hook's chained allreduces of several buckets can cross on gloo
        state = dist.group.WORLD if spec is None else None
        if spec == "psgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2)
            sent = psgd_bytes(model, 4)
        elif spec is not None:
            state = GradcodecState(None, spec, model=model)
        spent = []  # the hook's seconds a step, from its call to its future's completion (communication included)
        ddp.register_comm_hook(state, _timed(hook or default_hooks.allreduce_hook, spent))
        if hook is None:
            state = None
        times, hooks, coded = [], [], None
        for i in range(args.warmup + args.steps):
            if i == args.warmup and isinstance(state, GradcodecState) and state.summed is None:
                coded = (state.reducer.totals.bytes_sent, state.reducer.totals.encode_s + state.reducer.totals.decode_s)
            dist.barrier()
            t = time.perf_counter()
            ddp.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            dt = torch.tensor([time.perf_counter() - t])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if i >= args.warmup:
                times.append(dt.item())
                hooks.append(sum(spent))
            spent.clear()
        overhead = ""
        if isinstance(state, GradcodecState) and state.summed is not None:  # cast and all_reduce'd as it is: half the dense bytes
            sent = dense // 2
        if coded is not None:
            tot = state.reducer.totals
            sent = (tot.bytes_sent - coded[0]) / args.steps
            overhead = f"{1e3 * (tot.encode_s + tot.decode_s - coded[1]) / args.steps:.1f}"
        ms, hook_ms = 1e3 * float(np.median(times)), 1e3 * float(np.median(hooks))
        base = ms if base is None else base
        rows.append((label, f"{ms:.1f}", f"{base / ms:.2f}x", f"{hook_ms:.1f}", f"{sent:,.0f}", overhead))
        del ddp
    if rank == 0:
        head = ("configuration", "ms / step", "x dense step", "hook ms / step", "bytes sent / step (a rank)", "gradcodec encode + decode ms / step")
        title = f"DDP hooks on gloo, {size} processes, ResNet-18 ({dense // 4:,} parameters), batch {args.batch} of 3x32x32; median of {args.steps} steps"
        if args.markdown:
            print(f"**{title}**\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
            for r in rows:
                print("| " + " | ".join(r) + " |")
        else:
            print(title)
            for r in (head, *rows):
                print(f"{r[0]:<40} {r[1]:>10} {r[2]:>13} {r[3]:>15} {r[4]:>28} {r[5]:>12}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
