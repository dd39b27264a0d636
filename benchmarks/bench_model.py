"""Whole-model steps: every tensor of a model encoded and decoded, one call per tensor (format
v1 frames) against one many-tensor call (format v2, ``encode_many`` / ``decode_many``).

    python benchmarks/bench_model.py [--models small200,tiny200,sample,resnet50,bert] [--codecs ...]
                                     [--repeat 5] [--markdown]

Models: ``small200`` (200 float32 tensors of 1,000 to 10,000 elements: the per-tensor
overhead target of issue 15), ``tiny200`` (200 float32 tensors of 16 to 1,000 elements: a
small model's biases and norms, where only the Python per tensor counts), ``sample`` (the bundled CNN's 8 gradients of one step),
``resnet50`` (torchvision's 161 parameter shapes, 25.6M elements, Student-t(2) x 1e-3) and
``bert`` (BERT-base's 199 parameter shapes, 109.5M elements; not in the default list).

Per model and codec: the best of ``--repeat`` runs of

* ``per tensor``: ``[c.encode(x) for x in tensors]`` then ``c.decode(f, out=y)`` for each;
* ``many``: ``c.encode_many(tensors)`` then ``c.decode_many(frame, out=ys)``;
* ``joint``: the same with ``encode_many(tensors, joint=True)``: the tensors coded as one
  array, their concatenation, so the kernels do the same work with no per-tensor structure;
  ``many - joint`` per tensor is the per-tensor overhead (for top-k and PowerSGD the joint
  frame is another selection or factorisation of about the same work);
* ``EF many``: one ``ErrorFeedback(c).encode_many(tensors)`` step (residuals fed back), in
  steady state (three untimed steps first);

reported as microseconds per tensor (encode + decode), the many call's GB/s (of the float32
input) with its ratio to a memcpy of every tensor measured in the same run (``np.copyto``
tensor by tensor, the same calls a framework's copy would make), and the bytes on the wire
per step: the sum of the v1 frames, the v2 frame (table form), and the sections' payload alone
(so the difference is the framing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import best, bullets, footer, heading, log, machine_info, render  # noqa: E402

CODECS = ("none", "fp16", "bf16", "topk(ratio=0.01)", "randomk(ratio=0.01)", "adacomp", "qsgd", "rangefloat(bits=8)", "powersgd(rank=4)")


def bert_base_shapes() -> dict[str, tuple]:
    """Parameter shapes of BERT-base (uncased, 109,482,240 elements), Hugging Face names."""
    h, f, v = 768, 3072, 30522
    shapes = {
        "embeddings.word_embeddings.weight": (v, h),
        "embeddings.position_embeddings.weight": (512, h),
        "embeddings.token_type_embeddings.weight": (2, h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for i in range(12):
        p = f"encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[f"{p}.{name}.weight"] = (h, h)
            shapes[f"{p}.{name}.bias"] = (h,)
        shapes[f"{p}.attention.output.LayerNorm.weight"] = (h,)
        shapes[f"{p}.attention.output.LayerNorm.bias"] = (h,)
        shapes[f"{p}.intermediate.dense.weight"] = (f, h)
        shapes[f"{p}.intermediate.dense.bias"] = (f,)
        shapes[f"{p}.output.dense.weight"] = (h, f)
        shapes[f"{p}.output.dense.bias"] = (h,)
        shapes[f"{p}.output.LayerNorm.weight"] = (h,)
        shapes[f"{p}.output.LayerNorm.bias"] = (h,)
    shapes["pooler.dense.weight"] = (h, h)
    shapes["pooler.dense.bias"] = (h,)
    return shapes


def model(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2026)
    if name in ("small200", "tiny200"):
        low, high = (1000, 10_001) if name == "small200" else (16, 1_001)
        return {f"t{i}": (rng.standard_t(2, int(n)) * 1e-3).astype(np.float32) for i, n in enumerate(rng.integers(low, high, 200))}
    if name == "sample":
        from harness import load_steps

        return load_steps()["step0220"]
    if name == "resnet50":
        from transport.bench import resnet50_shapes

        shapes = resnet50_shapes()
    elif name == "bert":
        shapes = bert_base_shapes()
    else:
        raise SystemExit(f"--models: unknown model {name!r}")
    return {k: (rng.standard_t(2, s) * 1e-3).astype(np.float32) for k, s in shapes.items()}


def payload_bytes(frames) -> int:
    from codec.frame import parse_frame

    return sum(sum(s.stored_len for s in parse_frame(f).sections) for f in frames)


def measure(c, tensors, repeat: int) -> dict:
    xs = list(tensors.values())
    ys = [np.empty_like(x) for x in xs]
    frames = [c.encode(x) for x in xs]  # first calls (compile or cache load) out of the figures
    many = c.encode_many(tensors)
    c.decode_many(many, out=ys)
    for f, y in zip(frames, ys):
        c.decode(f, out=y)

    def per_tensor():
        fs = [c.encode(x) for x in xs]
        for f, y in zip(fs, ys):
            c.decode(f, out=y)

    def one_call():
        c.decode_many(c.encode_many(tensors), out=ys)

    def joint():
        c.decode_many(c.encode_many(tensors, joint=True), out=ys)

    joint()
    t_per = best(per_tensor, repeat)
    t_many = best(one_call, repeat)
    t_joint = best(joint, repeat)
    t_enc = best(lambda: c.encode_many(tensors), repeat)
    t_copy = best(lambda: [np.copyto(y, x) for x, y in zip(xs, ys)], repeat)
    import codec

    ef = codec.ErrorFeedback(c)
    for _ in range(3):
        ef.encode_many(tensors)
    t_ef = best(lambda: ef.encode_many(tensors), repeat)
    return {"per": t_per, "many": t_many, "joint": t_joint, "enc": t_enc, "copy": t_copy, "ef": t_ef, "v1": sum(len(f) for f in frames), "v2": len(many), "payload": payload_bytes(frames)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="small200,sample,resnet50")
    ap.add_argument("--codecs", default=";".join(CODECS), help="specs separated by ';'")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    import codec

    t_run = time.perf_counter()
    md = args.markdown
    bullets(machine_info(), md)
    for name in args.models.split(","):
        tensors = model(name)
        count = len(tensors)
        nbytes = sum(x.nbytes for x in tensors.values())
        rows = []
        for spec in args.codecs.split(";"):
            log(f"{name}: {spec} ...")
            try:
                r = measure(codec.get_codec(spec), tensors, args.repeat)
            except (ValueError, TypeError) as e:
                rows.append([spec, f"error: {e}"[:60]] + [""] * 9)
                continue
            rows.append([
                spec,
                f"{r['per'] / count * 1e6:.1f}",
                f"{r['many'] / count * 1e6:.1f}",
                f"{r['per'] / r['many']:.2f}x",
                f"{(r['many'] - r['joint']) / count * 1e6:.1f}",
                f"{nbytes / r['many'] / 1e9:.2f} ({r['copy'] / r['many']:.2f}x)",
                f"{r['enc'] / count * 1e6:.1f}",
                f"{r['ef'] / count * 1e6:.1f}",
                f"{r['v1']:,}",
                f"{r['v2']:,}",
                f"{(r['v2'] - r['payload']) / max(count, 1):.1f}",
            ])
        print()
        heading(f"{name}: {count} tensors, {nbytes / 1e6:.2f} MB float32 (encode + decode into out, per step)", md)
        print(render(["codec", "per tensor: us/tensor", "many: us/tensor", "speed-up", "many - joint: us/tensor", "many GB/s (x memcpy)",
                      "many encode us/tensor", "EF many us/tensor", "v1 bytes", "v2 bytes", "v2 framing B/tensor"], rows, md))
    footer(["memcpy: np.copyto of every tensor into a preallocated one, tensor by tensor, best of --repeat",
            "many - joint: the many call's time less that of joint=True (the tensors coded as ONE array, their concatenation: the same kernel work without per-tensor structure), per tensor: the per-tensor overhead",
            "v2 framing: the v2 frame's bytes beyond its sections' payload (header, layout table, counts), per tensor"],
           t_run, [], md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
