"""The CUDA path on a real GPU: every codec, on a device
array, next to a device-to-device copy of the same buffer (the bandwidth limit) in the same run.

    python benchmarks/bench_cuda.py [--n 25000000] [--repeat 20] [--codecs "none;fp16;topk(ratio=0.01);..."] [--markdown]

Needs a CUDA GPU and Numba's CUDA target (``pip install numba-cuda``); PyTorch, when present,
supplies the input as a CUDA tensor (so the ``__cuda_array_interface__`` path is the one
timed) and its own cast (``x.half()``, ``x.bfloat16()``) as a peer.  Every time is the best
of ``--repeat`` after two warm-up calls, with the device synchronized around each call.

Rows, for 25M float32 values:

- ``kernel``: the convert twin alone, device to device (``narrow_codes``), GB/s counting the
  bytes read and written, and the ratio to the device-to-device copy's GB/s;
- ``encode``: ``Codec.encode(x)`` (a new host frame), ``encode(x, out=pinned)`` into a
  pinned host buffer and ``ErrorFeedback.encode(x, out=pinned)`` (the residual on the
  device): the device work plus the frame's one copy to the host, next to a plain
  device-to-host copy of the same number of bytes (the link's limit);
- ``decode``: ``decode(frame, out=device array)`` and ``decode_add``: the codes' copy to the
  device plus the kernel, next to a host-to-device copy of the frame's bytes;
- the ``index`` twin alone: ``delta_decode`` of a 1.25% set's gaps and ``bitmap_count`` plus
  ``bitmap_decode`` of its bitmap (what a sparse frame's decode runs on its index section);
- the sparsifiers (topk, gaussiank, dgc, threshold, randomk, adacomp): the ``select`` twin's
  candidates pass alone (forming ``acc = x + r`` as error feedback does), then encode,
  ``ErrorFeedback.encode``, decode and decode_add through the codec, each as GB/s of the
  input's 100 MB, next to the device-to-device copy and to ``torch.topk(|x|, k=n/100)`` on
  the device (the peer a PyTorch top-k compressor calls; "x torch.topk" above 1 is faster);
- the ``spectral`` twin's FFT alone: ``rfft`` / ``irfft`` of the input as 4,096-value rows
  (radix-2 passes) and as 4,097-value rows (Bluestein), next to ``torch.fft`` (cuFFT) on the
  same rows; ``fft`` and ``fft(keep=global)`` run through the codec with the dense codecs;
- the peers: torch's cast on the device, ``torch.topk``, and powerSGD_hook's compute (its
  ``M Q``, Gram-Schmidt and ``M^T P`` at rank 4 on the input viewed as a square-ish matrix,
  without its allreduces) next to ``powersgd(rank=4)``'s encode of the same matrix;
- every dense codec's rows carry "x copy_ (time)": torch's ``copy_`` of the 25M float32
  buffer over the row's time, the ratio the targets are stated in;
- ``device CRC-32C``: the region kernel alone on 50 MB lying on no multiple of 8 (as a
  frame's payload does), in four shapes, and the byte-serial chunks it replaced;
- frames on the device: every codec's ``encode(x, out=device buffer)`` (header and CRC-32C
  included) and ``ErrorFeedback.encode`` into it, and ``decode`` of that device frame into a
  device array, each against torch's ``copy_`` (and fp16's against ``x.half()``);
- the transport (``--transport-ranks 2``): one ``Allreducer.reduce`` of device gradients on
  two ranks sharing the GPU, for fp16, top-k and ``none``, with the bytes that crossed host
  and device (benchmarks/bench_cuda_transport.py, under mpiexec);
- the whole-model step (``--model resnet50``): ResNet-50's 161 parameter shapes as device
  tensors, apart (one allocation each) and as views of one buffer (a framework's gradient
  bucket): ``ErrorFeedback.encode_many`` (DGC with momentum 0.9 too) and
  ``decode_add_many`` of its frame, at the step's steady state, next to a device-to-device
  copy of the whole model.  ``--model-scale s`` divides every shape's first dimension by
  ``s`` (a check in the simulator: ``--n 3000 --repeat 1 --model-scale 64``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import bullets, footer, heading, log, machine_info, render  # noqa: E402


cuda = None  # numba.cuda, set by main (kernels reach their intrinsics through a module global)

#: every registered codec, with the parameters the targets name: the elementwise and bucketed
#: codes, top-k at 1% and 0.1%, PowerSGD at rank 4 (on the input viewed as a square-ish
#: matrix), fft at its defaults (4,096-value blocks, theta 0.9) and globally
EVERY = (
    "none", "fp16", "bf16", "fp8", "fp8(scale=true)", "rangefloat(bits=8)", "minmax(bits=8)", "minmax(bits=4)",
    "qsgd", "qsgd(coding=elias)", "terngrad", "sign", "efsign", "onebit",
    "topk(ratio=0.01)", "topk(ratio=0.001)", "gaussiank(ratio=0.01)", "dgc(ratio=0.01)", "threshold(value=0.01)",
    "randomk(ratio=0.01)", "adacomp", "powersgd(rank=4)", "fft", "fft(keep=global)",
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--codecs", default=";".join(EVERY))
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--model", default="resnet50", help="the whole-model step's shapes: resnet50, or none to skip it")
    ap.add_argument("--model-scale", type=int, default=1)
    ap.add_argument("--model-codecs", default="fp16;topk(ratio=0.01);dgc(ratio=0.01)")
    ap.add_argument("--transport-ranks", type=int, default=2, help="ranks of the transport step with device gradients (benchmarks/bench_cuda_transport.py under mpiexec); 0 skips it")
    args = ap.parse_args(argv)
    global cuda  # a module global: the simulator swaps the one its kernels reach
    from numba import cuda

    import codec
    from codec.kernels import module

    t_run = time.perf_counter()
    md = args.markdown
    n = args.n
    name = getattr(cuda.get_current_device(), "name", "Numba's CUDA simulator")
    info = machine_info() + [f"GPU: {name.decode() if isinstance(name, bytes) else name}"]
    host = (np.random.default_rng(0).standard_t(2, n) * 1e-3).astype(np.float32)
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch without CUDA")
        x = torch.from_numpy(host).cuda()
        info.append(f"torch {torch.__version__}: the input is a torch CUDA tensor")
    except ImportError:
        torch = None
        x = cuda.to_device(host)
    bullets(info, md)

    def sync_best(fn, repeat=args.repeat):
        for _ in range(2):
            fn()
        cuda.synchronize()
        times = []
        for _ in range(repeat):
            cuda.synchronize()
            t = time.perf_counter()
            fn()
            cuda.synchronize()
            times.append(time.perf_counter() - t)
        return min(times)

    dx = cuda.as_cuda_array(x) if torch is not None else x
    dst = cuda.device_array(n, np.float32)
    if torch is not None:  # torch's copy_ reaches the memory's bandwidth; Numba's D2D copy does not
        tdst = torch.empty_like(x)
        copy_s, copy_what = sync_best(lambda: tdst.copy_(x)), "device-to-device copy, torch copy_ (reference)"
        numba_s = sync_best(lambda: dst.copy_to_device(dx))
    else:
        copy_s, copy_what, numba_s = sync_best(lambda: dst.copy_to_device(dx)), "device-to-device copy (reference)", None
    copy_gbs = 8 * n / copy_s / 1e9
    rows = [[copy_what, f"{copy_s * 1e3:.3f}", f"{copy_gbs:.0f}", "1.00x"]]
    if numba_s is not None:
        rows.append(["device-to-device copy, Numba copy_to_device", f"{numba_s * 1e3:.3f}", f"{8 * n / numba_s / 1e9:.0f}", f"{copy_s / numba_s:.2f}x"])

    def row(name, seconds, nbytes, ref_gbs):
        g = nbytes / seconds / 1e9
        rows.append([name, f"{seconds * 1e3:.3f}", f"{g:.0f}", f"{g / ref_gbs:.2f}x"])

    conv = module("convert", "cuda")

    @cuda.jit
    def grid_copy(src, dst):  # the floor of a Numba kernel here: launch plus one read and one write
        for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
            dst[i] = src[i]

    from codec.kernels.cuda._common import launch

    blocks, threads = shape = launch(n)
    row(f"Numba grid-stride copy kernel ({blocks} blocks of {threads})", sync_best(lambda: grid_copy[shape](dx, dst)), 8 * n, copy_gbs)
    codes = cuda.device_array(n, np.uint16)
    r, acc = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    r.copy_to_device(dx)
    counts = conv._counts(blocks)
    row("  of which: the launch of narrow (no count read back)", sync_best(lambda: conv._narrow32[shape](dx, codes, False, counts[0])), 6 * n, copy_gbs)
    rows.append(["  of which: reading the per-block counts back", f"{sync_best(lambda: conv._total(counts)) * 1e3:.3f}", "", ""])
    from codec.kernels.cuda import _crc

    payload = codes.view(np.uint8)[3:]  # as a frame's payload lies: on no multiple of 8
    for threads, per in ((_crc.REGION_THREADS, _crc.REGION_WORDS), (128, 64), (512, 16), (256, 128)):
        t = sync_best(lambda: _crc.crc32c(payload, 0, threads=threads, per=per))
        what = "the default" if (threads, per) == (_crc.REGION_THREADS, _crc.REGION_WORDS) else "another shape"
        rows.append([f"device CRC-32C of {payload.size / 1e6:.0f} MB (a frame's payload), regions of {threads} threads x {per} words ({what})", f"{t * 1e3:.3f}", f"{payload.size / t / 1e9:.0f}", f"{payload.size / t / copy_gbs / 1e9 * 2:.2f}x"])
    t = sync_best(lambda: _crc._pieces(payload, _crc.CHUNK_BITS, _crc.GROUP))
    rows.append(["device CRC-32C of the same, byte-serial 1 KiB chunks (the kernel before 2026-11-29)", f"{t * 1e3:.3f}", f"{payload.size / t / 1e9:.0f}", ""])
    for bf16 in (False, True):
        row(f"narrow_codes {'bf16' if bf16 else 'fp16'} (kernel)", sync_best(lambda: conv.narrow_codes(dx, codes, bf16, -1)), 6 * n, copy_gbs)
    for bf16 in (False, True):
        row(f"half_feedback {'bf16' if bf16 else 'fp16'} (kernel: x, r -> codes, acc)", sync_best(lambda: conv.half_feedback(dx, r, acc, codes, bf16, -1)), 14 * n, copy_gbs)
    out = cuda.device_array(n, np.float32)
    for bf16 in (False, True):
        row(f"half_decode {'bf16' if bf16 else 'fp16'} (kernel, SET)", sync_best(lambda: conv.half_decode(codes, out, 0, bf16)), 6 * n, copy_gbs)
        row(f"half_decode {'bf16' if bf16 else 'fp16'} (kernel, ADD)", sync_best(lambda: conv.half_decode(codes, out, 1, bf16)), 10 * n, copy_gbs)
    spectral = module("spectral", "cuda")
    rows4k = dx[: n // 4096 * 4096].reshape(n // 4096, 4096)
    spec4k = spectral.rfft(rows4k)
    fft_bytes = 4 * rows4k.size + 4 * spec4k.size  # read the rows, write the half spectra
    row("spectral rfft, 4,096-value rows (kernel: Stockham passes)", sync_best(lambda: spectral.rfft(rows4k)), fft_bytes, copy_gbs)
    row("spectral irfft, 4,096-value rows (kernel)", sync_best(lambda: spectral.irfft(spec4k, 4096)), fft_bytes, copy_gbs)
    rows4k1 = dx[: n // 4097 * 4097].reshape(n // 4097, 4097)
    row("spectral rfft, 4,097-value rows (kernel: Bluestein, m = 16,384)", sync_best(lambda: spectral.rfft(rows4k1)), fft_bytes, copy_gbs)
    if torch is not None:
        t4k = x[: n // 4096 * 4096].reshape(-1, 4096)
        row("torch.fft.rfft, 4,096-value rows (peer: cuFFT)", sync_best(lambda: torch.fft.rfft(t4k, dim=1)), fft_bytes, copy_gbs)
        row("torch.fft.irfft, 4,096-value rows (peer: cuFFT)", sync_best(lambda: torch.fft.irfft(torch.fft.rfft(t4k, dim=1), n=4096, dim=1)), fft_bytes, copy_gbs)
        row("torch x.half() (peer)", sync_best(lambda: x.half()), 6 * n, copy_gbs)
        row("torch x.bfloat16() (peer)", sync_best(lambda: x.bfloat16()), 6 * n, copy_gbs)
        topk_s = sync_best(lambda: torch.topk(x.abs(), max(1, n // 100)), max(3, args.repeat // 4))
        row(f"torch.topk(|x|, k={max(1, n // 100)}) (peer)", topk_s, 4 * n, copy_gbs)
    else:
        topk_s = None
    sel = module("select", "cuda")
    from codec.layout import CHUNK, chunks

    nchunk = chunks(n)
    cut = np.float32(np.partition(np.abs(host[:: max(1, n // 65536)]), -max(1, 65536 // 80))[-max(1, 65536 // 80)])  # about 1.25% of |x|
    cap = min(CHUNK, 2 * n // 80 // nchunk + 64)
    buf, vals = cuda.device_array((nchunk, cap), np.int64), cuda.device_array((nchunk, cap), np.float32)
    cnt, bad = cuda.device_array(nchunk, np.int64), cuda.device_array(nchunk, np.int64)
    nosums, empty = cuda.device_array((0, 2)), cuda.device_array(0, np.float32)
    whole = np.array([0, nchunk])
    row(f"select candidates, |x| >= cut (kernel, {nchunk} chunks)", sync_best(lambda: sel.candidates(dx, empty, empty, cut, whole, buf, vals, cnt, bad, nosums, 0.0, 64)), 4 * n, copy_gbs)
    row("select candidates, acc = x + r formed (kernel: x, r -> acc)", sync_best(lambda: sel.candidates(dx, r, acc, cut, whole, buf, vals, cnt, bad, nosums, 0.0, 64)), 12 * n, copy_gbs)
    ind = module("index", "cuda")  # a decode's index section read on the device: the same ~1.25% of positions
    kept = np.flatnonzero(np.abs(host) >= cut).astype(np.int64)
    gaps = cuda.to_device(np.diff(kept, prepend=-1).astype(np.uint64) - np.uint64(1))
    dpos = cuda.device_array(kept.size, np.int64)
    row(f"index delta_decode, {kept.size:,} gaps (kernels: the positions' running sum)", sync_best(lambda: ind.delta_decode(gaps, n, dpos)), 16 * kept.size, copy_gbs)
    bitmap = cuda.device_array((n + 7) // 8, np.uint8)
    ind.bitmap_encode(cuda.to_device(kept), bitmap)
    starts = np.concatenate([[0], np.cumsum(ind.bitmap_count(bitmap)[:-1])]).astype(np.int64)
    row(f"index bitmap_count + bitmap_decode, {n:,} bits (kernels)", sync_best(lambda: (ind.bitmap_count(bitmap), ind.bitmap_decode(bitmap, starts, dpos))), 2 * bitmap.size + 8 * kept.size, copy_gbs)

    # the link: a plain device-to-host copy into pinned memory, and host-to-device
    pinned = cuda.pinned_array(4 * n + (1 << 20), np.uint8)
    d2h_s = sync_best(lambda: dst.copy_to_host(pinned[: 4 * n].view(np.float32)))
    d2h_gbs = 4 * n / d2h_s / 1e9
    h2d_s = sync_best(lambda: dst.copy_to_device(pinned[: 4 * n].view(np.float32)))
    h2d_gbs = 4 * n / h2d_s / 1e9
    link = [["device-to-host copy, pinned (reference)", f"{d2h_s * 1e3:.3f}", f"{d2h_gbs:.1f}", "1.00x", f"{copy_s / d2h_s:.3f}x", ""],
            ["host-to-device copy, pinned (reference)", f"{h2d_s * 1e3:.3f}", f"{h2d_gbs:.1f}", "1.00x", f"{copy_s / h2d_s:.3f}x", ""]]
    sparse = []
    on_device = []  # per codec: encode into a device frame, CRC included, and decode from it
    half_s = sync_best(lambda: x.half()) if torch is not None else None
    rows_m = max(1, int(np.sqrt(n)))  # PowerSGD's matrix: rows_m x (n // rows_m), the input's head
    matrix = (x[: rows_m * (n // rows_m)].view(rows_m, -1) if torch is not None else dx[: rows_m * (n // rows_m)].reshape(rows_m, n // rows_m))
    peer_psgd = None
    if torch is not None:
        try:
            from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

            q0 = torch.randn(matrix.shape[1], 4, device=matrix.device)

            def hook_step():  # powerSGD_hook's compute without its allreduces: P = M Q, orthogonalise, Q = M^T P
                p = torch.matmul(matrix, q0)
                _orthogonalize(p)
                return torch.matmul(matrix.t(), p)

            peer_psgd = sync_best(hook_step)
            row(f"torch powerSGD_hook step, rank 4, {matrix.shape[0]} x {matrix.shape[1]} (peer: its matmuls and Gram-Schmidt)", peer_psgd, 8 * matrix.numel(), copy_gbs)
        except ImportError:
            pass
    for spec in [s.strip() for s in args.codecs.split(";") if s.strip()]:
        log(f"{spec} ...")
        c = codec.get_codec(spec)
        xin = matrix if spec.startswith("powersgd") else x
        frame = bytes(c.encode(xin))
        fb = len(frame)
        t_new = sync_best(lambda: c.encode(xin), max(3, args.repeat // 2))
        t_pin = sync_best(lambda: c.encode(xin, out=pinned))
        outd = cuda.device_array(tuple(xin.shape), np.float32)
        pframe = np.frombuffer(frame, np.uint8)
        hostframe = cuda.pinned_array(fb, np.uint8)
        hostframe[:] = pframe
        t_dec = sync_best(lambda: c.decode(hostframe, out=outd))
        t_add = sync_best(lambda: c.decode_add(hostframe, outd))
        ef = codec.ErrorFeedback(c)
        t_ef = sync_best(lambda: ef.encode(xin, key="g", out=pinned))
        devbuf = cuda.device_array(c.max_frame_bytes(xin), np.uint8)  # allocated once from the bound, as a training loop would
        dframe = c.encode(xin, out=devbuf)  # the frame written on the device, header and CRC-32C included
        t_dev = sync_best(lambda: c.encode(xin, out=devbuf))
        t_devdec = sync_best(lambda: c.decode(dframe, out=outd))
        t_devef = sync_best(lambda: ef.encode(xin, key="g", out=devbuf))
        on_device.append([spec, f"{fb / 1e6:.2f}", f"{t_dev * 1e3:.3f}", f"{copy_s / t_dev:.2f}x", f"{half_s / t_dev:.2f}x" if half_s and spec == "fp16" else "",
                          f"{t_devef * 1e3:.3f}", f"{t_devdec * 1e3:.3f}", f"{copy_s / t_devdec:.2f}x"])
        if c.select is not None:  # a sparse frame: its time against the input's bandwidth and torch.topk
            for what, t in (("encode, new frame", t_new), ("ErrorFeedback.encode, out=pinned", t_ef),
                            ("decode into a device array", t_dec), ("decode_add into a device array", t_add)):
                g = 4 * n / t / 1e9
                sparse.append([f"{spec} {what}", f"{t * 1e3:.3f}", f"{fb / 1e6:.2f}", f"{g:.0f}", f"{g / copy_gbs:.2f}x",
                               f"{topk_s / t:.2f}x" if topk_s else ""])
            continue
        for what, t, ref in ((f"{spec} encode, new frame", t_new, d2h_gbs), (f"{spec} encode, out=pinned", t_pin, d2h_gbs),
                             (f"{spec} ErrorFeedback.encode, out=pinned", t_ef, d2h_gbs),
                             (f"{spec} decode into a device array", t_dec, h2d_gbs), (f"{spec} decode_add into a device array", t_add, h2d_gbs)):
            g = fb / t / 1e9
            peer = f"{peer_psgd / t:.2f}x" if spec.startswith("powersgd") and peer_psgd and "encode" in what else ""
            link.append([what, f"{t * 1e3:.3f}", f"{g:.1f}", f"{g / ref:.2f}x", f"{copy_s / t:.3f}x", peer])
    print()
    heading(f"CUDA kernels on {n:,} float32, device to device; best of {args.repeat}", md)
    print(render(["what", "ms", "GB/s (read + written)", "x copy"], rows, md))
    print()
    heading("Through the codec: the frame crosses the host link once (GB/s of frame bytes)", md)
    print(render(["what", "ms", "GB/s (frame bytes)", "x link", "x copy_ (time)", "x powerSGD_hook"], link, md))
    if sparse:
        print()
        heading("Sparsifiers through the codec: GB/s of the input's bytes; x torch.topk: its time over ours (> 1: faster)", md)
        print(render(["what", "ms", "frame MB", "GB/s (input)", "x copy", "x torch.topk"], sparse, md))
    print()
    heading("Frames on the device: encode(x, out=device buffer), header and CRC-32C included; decode(device frame, out=device array); x copy_: torch copy_'s time over ours", md)
    print(render(["codec", "frame MB", "encode ms", "x copy_", "x torch half()", "ErrorFeedback.encode ms", "decode ms", "x copy_"], on_device, md))
    if args.transport_ranks:
        print()
        transport_step(args, md)
    if args.model != "none":
        print()
        model_step(args, md, sync_best)
    footer(["encode forms the frame's CRC-32C on the device and copies the frame's bytes to the host once; decode checks the CRC on the host, copies the codes to the device and runs the kernel",
            "a device frame is written, checksummed and read on the device: only its header crosses the link"], t_run, [], md)


def transport_step(args, md):
    """One ``Allreducer.reduce`` step of device gradients on ``--transport-ranks`` ranks sharing
    this GPU (benchmarks/bench_cuda_transport.py under mpiexec): its time and the bytes that
    crossed between host and device, against a dense device-to-host-to-device step."""
    import shutil
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is None:
        log("no mpiexec: the transport step is skipped")
        return
    cmd = [mpiexec, "-n", str(args.transport_ranks), sys.executable, "-m", "mpi4py", os.path.join(here, "bench_cuda_transport.py"), "--n", str(args.n), "--repeat", str(max(3, args.repeat // 4))]
    if md:
        cmd.append("--markdown")
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(got.stdout, end="")
    if got.returncode:
        log(f"the transport step failed ({got.returncode}): {got.stderr[-2000:]}")


def model_step(args, md, sync_best):
    """The whole-model rows: ResNet-50's tensors apart and as views of one buffer."""
    import codec
    from transport.bench import resnet50_shapes

    shapes = [(max(1, s[0] // args.model_scale),) + tuple(s[1:]) for s in resnet50_shapes().values()]
    sizes = [int(np.prod(s)) for s in shapes]
    at = np.concatenate([[0], np.cumsum(sizes)])
    host = (np.random.default_rng(1).standard_t(2, int(at[-1])) * 1e-3).astype(np.float32)
    bucket = cuda.to_device(host)
    kinds = {"apart": [cuda.to_device(host[a:b]).reshape(s) for a, b, s in zip(at, at[1:], shapes)],
             "bucket": [bucket[a:b].reshape(s) for a, b, s in zip(at, at[1:], shapes)]}
    copy_dst = cuda.device_array(int(at[-1]), np.float32)
    copy_s = sync_best(lambda: copy_dst.copy_to_device(bucket))
    rows = [[f"device-to-device copy of the model ({at[-1] * 4 / 1e6:.0f} MB, reference)", f"{copy_s * 1e3:.3f}", "1.00x"]]
    for spec in [s.strip() for s in args.model_codecs.split(";") if s.strip()]:
        log(f"model {spec} ...")
        for momentum in (0.0, 0.9) if spec.startswith("dgc") else (0.0,):
            for kind, ts in kinds.items():
                ef = codec.ErrorFeedback(spec, momentum=momentum)
                frame = ef.encode_many(ts)  # the first steps make the residuals (then the runs' buffers)
                ef.encode_many(ts)
                t = sync_best(lambda: ef.encode_many(ts), max(3, args.repeat // 4))
                m = f", momentum {momentum}" if momentum else ""
                rows.append([f"{spec}{m}: ErrorFeedback.encode_many, {kind}", f"{t * 1e3:.3f}", f"{t / copy_s:.1f}x"])
                if not momentum:
                    t = sync_best(lambda: codec.decode_add_many(frame, ts), max(3, args.repeat // 4))
                    rows.append([f"{spec}: decode_add_many, {kind}", f"{t * 1e3:.3f}", f"{t / copy_s:.1f}x"])
    heading(f"The whole-model step: {len(shapes)} tensors of {args.model} ({at[-1]:,} float32), apart and as views of one buffer", md)
    print(render(["what", "ms", "x copy time"], rows, md))


if __name__ == "__main__":
    main()
