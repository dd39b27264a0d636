"""gradcodec next to its peers' own math, in one process on the same arrays and threads.

    python benchmarks/bench_peers.py [--workloads 25M,sample,resnet50] [--codecs fp16,bf16,topk,topk-ef,randomk,qsgd,powersgd,powersgd-ef]
                                     [--repeat 7] [--load N] [--markdown]

Issue 15 asks that no codec be slower than its best peer, on one 25M-element gradient and on
many small tensors, measured in the same run. The peers run on CPU without a process group;
each is a faithful port of what it computes per step, in PyTorch (optional: ``pip install
torch==2.13.0``; without it the script says so and exits):

* ``fp16`` / ``bf16``: DDP's ``fp16_compress_hook`` / ``bf16_compress_hook``: the bucket
  (every gradient of the step, flat; DDP keeps them there, so building it is not timed) cast
  with ``bucket.to(dtype)``, and back with ``bucket.copy_(half)``.
* ``topk``: GRACE's ``TopKCompressor`` (ratio 0.01), per tensor:
  ``torch.topk(t.abs(), k, sorted=False)`` and ``torch.gather``; decompressed with
  ``out.zero_()`` and ``out.scatter_(0, indices, values)``.
* ``topk-ef``: the same with GRACE's ``ResidualMemory`` (error feedback, beta = gamma = 1),
  per tensor: ``acc = t + residual``, top-k of ``acc`` as above, ``residual = acc -
  decompressed`` (the decompression's zeros and scatter); gradcodec's side is
  ``ErrorFeedback(spec).encode`` per tensor and ``ErrorFeedback(spec).encode_many``, the
  residuals kept the same way.  Decoding is top-k's.
* ``randomk``: GRACE's ``RandomKCompressor`` (ratio 0.01): ``torch.randperm(n)[:k]`` and
  a gather; decompressed as top-k.
* ``qsgd``: GRACE's ``QSGDCompressor`` (s = 16 levels): one norm per tensor, stochastic
  levels as int8 and the norm; decompressed as ``norm / s * levels``. gradcodec's qsgd has one
  norm per 512-value bucket, which is more work and more accuracy.
* ``powersgd``: PyTorch's ``powerSGD_hook`` math at rank 4 (its own ``_orthogonalize``),
  per matrix ``M`` (a tensor viewed as ``(shape[0], -1)``, ``n x m``, at rank ``min(n, m, 4)``;
  1-D tensors, and those the hook finds not worth compressing at its default
  ``min_compression_rate`` of 2, are sent as they are, as the hook does): ``P = M Q``,
  orthogonalise ``P``, ``Q = M^T P``; decompressed with ``P Q^T`` into ``out``. The 25M
  gradient is viewed as 5000 x 5000 by both sides.
* ``powersgd-ef``: the same with the hook's error feedback (its default,
  ``use_error_feedback=True``), per tensor: ``acc = t + error``, the products of ``acc`` as
  above, ``error = acc - P Q^T`` (the hook keeps a copy of ``acc`` and subtracts its
  decompression); gradcodec's side is ``ErrorFeedback(spec)``, as for ``topk-ef``.  Both
  start each matrix's power iteration from its last ``Q`` (warm start, the hook's default).
  Decoding is PowerSGD's.

gradcodec's side is the call a user makes: ``encode`` (a self-describing frame of bytes with
its CRC-32C) and ``decode(frame, out=)``, one call per tensor and, for the many-tensor
workloads, one ``encode_many`` / ``decode_many`` call. Every figure is the best of
``--repeat``; the ratio is the peer's time over gradcodec's (above 1: gradcodec is faster).
Both sides use the same thread count; the script sets gradcodec's passive OpenMP wait
(``codec.threads.prepare_numba``) before torch loads, since two spinning pools on two cores
measure each other.

``--load N`` measures on a busy machine: N other processes spin on the CPU for the whole run
(issue 33 asks for two on this 2-core machine), and every figure is then the median of
``--repeat`` calls instead of the best (the best of a loaded run is the luck of the draw).
Workloads ``bert`` (BERT-base's 199 tensors, 109.5M elements) is also known (benchmarks/bench_model.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import best, bullets, busy, footer, heading, log, machine_info, render, synthetic  # noqa: E402

CODECS = ("fp16", "bf16", "topk", "topk-ef", "randomk", "qsgd", "powersgd", "powersgd-ef")
SPECS = {"fp16": "fp16", "bf16": "bf16", "topk": "topk(ratio=0.01)", "topk-ef": "topk(ratio=0.01)", "randomk": "randomk(ratio=0.01)", "qsgd": "qsgd(levels=16)", "powersgd": "powersgd(rank=4)", "powersgd-ef": "powersgd(rank=4)"}
#: the rows whose step keeps residuals (gradcodec: ``ErrorFeedback``; the peer: GRACE's ``ResidualMemory``)
FEEDBACK = {"topk-ef", "powersgd-ef"}
RATIO, LEVELS, RANK = 0.01, 16, 4


def workload(name):
    if name == "25M":
        return {"g": synthetic(25_000_000).reshape(5000, 5000)}
    from bench_model import model

    return model(name)


# --------------------------------------------------------------------------- the peers
class Peer:
    """``encode(tensors) -> state`` and ``decode(state, outs)`` over torch tensors."""

    def __init__(self, codec, tensors):
        import torch

        self.torch = torch
        self.codec = codec
        self.ts = [torch.from_numpy(np.ascontiguousarray(t)) for t in tensors.values()]
        if codec in ("fp16", "bf16"):
            self.bucket = torch.cat([t.reshape(-1) for t in self.ts])
            self.dtype = torch.float16 if codec == "fp16" else torch.bfloat16
        if codec in FEEDBACK:
            self.residuals = [torch.zeros(t.numel(), dtype=t.dtype) for t in self.ts]
        if codec.startswith("powersgd"):
            from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

            self.orthogonalize = _orthogonalize
            g = torch.Generator().manual_seed(0)
            self.qs = [self._q(t, g) for t in self.ts]

    def _q(self, t, g):
        """The hook's Q for tensor ``t`` (``(m, min(n, m, RANK))``), or None for a tensor the
        hook sends as it is: 1-D, or not worth compressing at its default
        ``min_compression_rate`` of 2 (``_should_compress``)."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        if t.dim() < 2:
            return None
        n, m = t.reshape(t.shape[0], -1).shape
        rank = min(n, m, RANK)
        return self.torch.randn(m, rank, generator=g) if _should_compress(n, m, rank, 2)[0] else None

    def encode(self):
        torch, c = self.torch, self.codec
        if c in ("fp16", "bf16"):
            return self.bucket.to(self.dtype)
        out = []
        for i, t in enumerate(self.ts):
            flat = t.reshape(-1)
            n = flat.numel()
            k = max(1, int(n * RATIO))
            if c == "topk":
                _, idx = torch.topk(flat.abs(), k, sorted=False)
                out.append((idx, torch.gather(flat, 0, idx)))
            elif c == "topk-ef":  # compensate, compress, decompress, update (GRACE's ResidualMemory)
                acc = flat + self.residuals[i]
                _, idx = torch.topk(acc.abs(), k, sorted=False)
                vals = torch.gather(acc, 0, idx)
                sent = torch.zeros_like(acc).scatter_(0, idx, vals)
                self.residuals[i] = acc - sent
                out.append((idx, vals))
            elif c == "randomk":
                idx = torch.randperm(n)[:k]
                out.append((idx, torch.gather(flat, 0, idx)))
            elif c == "qsgd":
                norm = flat.norm()
                level_float = LEVELS / norm * flat.abs()
                previous = level_float.floor()
                prob = torch.empty_like(flat).uniform_()
                new_level = previous + (prob < (level_float - previous)).type(torch.float32)
                out.append(((new_level * flat.sign()).type(torch.int8), norm))
            else:  # powersgd, powersgd-ef
                ef = c == "powersgd-ef"
                acc = flat + self.residuals[i] if ef else flat
                if self.qs[i] is None:
                    out.append(acc)  # the hook allreduces 1-D and small tensors as they are (their error: zero)
                    if ef:
                        self.residuals[i].zero_()
                    continue
                m = acc.reshape(t.shape[0], -1)
                p = m @ self.qs[i]
                self.orthogonalize(p.unsqueeze(0))
                self.qs[i] = m.t() @ p
                if ef:  # the hook's error: its copy of acc minus the decompression
                    self.residuals[i] = (m - p @ self.qs[i].t()).reshape(-1)
                out.append((p, self.qs[i]))
        return out

    def decode(self, state, outs):
        torch, c = self.torch, self.codec
        if c in ("fp16", "bf16"):
            self.bucket.copy_(state)  # the hook's decompress: back into the bucket
            return
        for s, o in zip(state, outs):
            flat = o.reshape(-1)
            if c in ("topk", "topk-ef", "randomk"):
                flat.zero_()
                flat.scatter_(0, s[0], s[1])
            elif c == "qsgd":
                torch.mul(s[0].type(torch.float32), s[1] / LEVELS, out=flat)
            elif isinstance(s, tuple):  # powersgd
                torch.matmul(s[0], s[1].t(), out=o.reshape(s[0].shape[0], -1))
            else:
                flat.copy_(s)


# --------------------------------------------------------------------------- gradcodec
def ours(spec, tensors, outs, repeat, stat=min, feedback: bool = False):
    import codec

    c = codec.get_codec(spec)
    xs, ys = list(tensors.values()), list(outs.values())
    frames = [c.encode(x) for x in xs]
    [codec.decode(f, out=y) for f, y in zip(frames, ys)]
    alone, together = codec.ErrorFeedback(spec), codec.ErrorFeedback(spec)
    one = (lambda: [alone.encode(x, key=k) for k, x in tensors.items()]) if feedback else (lambda: [c.encode(x) for x in xs])
    many = (lambda: together.encode_many(tensors)) if feedback else (lambda: c.encode_many(tensors))
    one()
    res = {
        "enc1": best(one, repeat, stat),
        "dec1": best(lambda: [codec.decode(f, out=y) for f, y in zip(frames, ys)], repeat, stat),
    }
    if len(xs) > 1:
        frame = many()
        codec.decode_many(frame, out=outs)
        res["encm"] = best(many, repeat, stat)
        res["decm"] = best(lambda: codec.decode_many(frame, out=outs), repeat, stat)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="25M,sample,resnet50")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--load", type=int, default=0, help="other processes spinning on the CPU during the run (medians then)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    from codec import threads

    threads.prepare_numba()  # before either OpenMP runtime starts: both wait passively (2 pools share the cores)
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install torch==2.13.0): the peers run in PyTorch; nothing to compare")
        return
    t_run = time.perf_counter()
    md = args.markdown
    stat = statistics.median if args.load else min
    bullets(machine_info() + [f"torch {torch.__version__}, {torch.get_num_threads()} threads",
                              f"load: {args.load} other busy processes; figures are {'medians' if args.load else 'the best'} of {args.repeat}"], md)
    with busy(args.load):
        rows = measure(args, torch, stat)
    print()
    what = "median" if args.load else "best"
    heading(f"gradcodec against its peers, ms per step ({what} of --repeat); ratio = peer time / gradcodec's {what} time", md)
    print(render(["workload", "tensors / elements", "codec", "peer enc", "enc (per tensor)", "enc (many)", "enc ratio",
                  "peer dec", "dec (per tensor)", "dec (many)", "dec ratio"], rows, md))
    footer(["peers: fp16/bf16 DDP compress hooks on one flat bucket; topk/randomk/qsgd GRACE's compressors per tensor "
            "(topk-ef: with its ResidualMemory, against gradcodec's ErrorFeedback); "
            "powersgd PyTorch's powerSGD_hook math per matrix (1-D tensors copied; powersgd-ef: with the hook's error feedback, "
            "against gradcodec's ErrorFeedback)",
            "gradcodec: frames of bytes with their CRC-32C, decoded into preallocated arrays"], t_run, [], md)


def measure(args, torch, stat) -> list:
    """The table's rows: per workload and codec, the peer's and gradcodec's times."""
    rows = []
    for wl in args.workloads.split(","):
        tensors = workload(wl)
        outs = {k: np.empty_like(v) for k, v in tensors.items()}
        n = sum(v.size for v in tensors.values())
        for name in args.codecs.split(","):
            log(f"{wl}: {name} ...")
            peer = Peer(name, tensors)
            touts = [torch.from_numpy(o) for o in outs.values()]
            for _ in range(2):  # warm: first calls, thread pools
                state = peer.encode()
                peer.decode(state, touts)
            pe, pd = best(peer.encode, args.repeat, stat), best(lambda: peer.decode(state, touts), args.repeat, stat)
            g = ours(SPECS[name], tensors, outs, args.repeat, stat, name in FEEDBACK)
            e, d = min(g["enc1"], g.get("encm", np.inf)), min(g["dec1"], g.get("decm", np.inf))
            ms = lambda v: f"{v * 1e3:.3f}" if v < np.inf else "-"  # noqa: E731
            rows.append([wl, f"{len(tensors)} / {n:,}", SPECS[name] + (" + EF" if name in FEEDBACK else ""), ms(pe), ms(g["enc1"]), ms(g.get("encm", np.inf)), f"{pe / e:.2f}x",
                         ms(pd), ms(g["dec1"]), ms(g.get("decm", np.inf)), f"{pd / d:.2f}x"])
    return rows


if __name__ == "__main__":
    main()
