"""Train a small CNN with PyTorch DDP and gradcodec's communication hook, next to plain DDP.

    torchrun --nproc-per-node 2 examples/ddp_train.py --spec "topk(ratio=0.01)+fp16"

Both runs start from the same weights and see the same batches (each rank its own shard of a
synthetic 10-class image task: class-dependent blobs on noise, generated from a seed, so
nothing downloads).  Every ``--every`` steps, rank 0 prints the loss, the bytes this rank
sent a step (plain DDP: the gradients' float32 bytes; the hook: its frames, headers
included, from the reducer's ``Stats``, over the window's compressed steps) and the mean time per step; at the end, the test
accuracy of both.  gloo on CPU; needs torch (``pip install -e ".[torch]"``).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from transport.ddp import GradcodecState, gradcodec_hook


def model_of(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    )


def data(n: int, seed: int):
    """``n`` 16x16 images of 10 classes: a class's blob (its place and size) on noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    cy, cx = 3.0 + (y % 5).float() * 2.5, 4.0 + (y // 5).float() * 8.0
    blob = torch.exp(-((yy - cy[:, None, None]) ** 2 + (xx - cx[:, None, None]) ** 2) / 6.0)
    return (blob + 0.6 * torch.randn(n, 16, 16, generator=g)).unsqueeze(1), y


def run(args, hook: bool):
    rank, size = dist.get_rank(), dist.get_world_size()
    model = model_of(0)
    ddp = DDP(model)
    state = None
    if hook:
        state = GradcodecState(None, args.spec, model=model, start_iter=args.start_iter)
        ddp.register_comm_hook(state, gradcodec_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = data(args.steps * args.batch * size, 1)
    dense_bytes = sum(p.numel() * 4 for p in model.parameters())
    t_sum, sent_before, compressed = 0.0, 0, 0
    for step in range(args.steps):
        at = (step * size + rank) * args.batch
        xb, yb = x[at : at + args.batch], y[at : at + args.batch]
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        t_sum += time.perf_counter() - t
        compressed += state is not None and state.iter > state.start_iter  # (this step went through the hook's codec)
        if (step + 1) % args.every == 0:
            if compressed:
                total = state.reducer.totals.bytes_sent
                sent, sent_before, compressed = (total - sent_before) / compressed, total, 0
            else:
                sent = dense_bytes
            if rank == 0:
                print(f"{'hook' if hook else 'ddp '} step {step + 1:4d}  loss {loss.item():.4f}  sent {sent:10,.0f} B/step  {1e3 * t_sum / args.every:7.1f} ms/step", flush=True)
            t_sum = 0.0
    xt, yt = data(2000, 2)
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    return acc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="topk(ratio=0.01)+fp16")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--start-iter", type=int, default=10, help="dense warm-up steps before compressing")
    ap.add_argument("--every", type=int, default=25)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    plain = run(args, hook=False)
    hooked = run(args, hook=True)
    if dist.get_rank() == 0:
        print(f"test accuracy: plain DDP {plain:.3f}, gradcodec {args.spec} {hooked:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
