"""Generate ``codec/data/sample.npz``: real gradients of a small CNN trained on sklearn digits.

Usage (from the repository root)::

    python scripts/make_sample.py            # writes codec/data/sample.npz and steps.npz
    python scripts/make_sample.py --out X.npz --steps-out Y.npz

Everything is plain NumPy (hand-written forward and backward passes), seeded, and runs
offline: ``sklearn.datasets.load_digits`` ships with scikit-learn.

Model (PyTorch-style parameter shapes, NCHW activations, 1x8x8 inputs scaled to [0, 1]):

    conv1  (8, 1, 3, 3) + bias, padding 1   -> 8x8x8,  ReLU
    conv2  (16, 8, 3, 3) + bias, padding 1  -> 16x8x8, ReLU, 2x2 max-pool -> 16x4x4
    fc1    (128, 256) + bias                -> ReLU
    fc2    (10, 128) + bias                 -> softmax cross-entropy

Training: SGD with momentum 0.9, learning rate 0.05, batch 64, 20 epochs, in float32.
Before training the backward pass is checked against central finite differences in
float64 on a tiny batch (relative error < 1e-4 for every parameter tensor).

The saved tensors are the float32 mini-batch gradients (batch 64, mean loss over the
batch, no weight decay) of every parameter, taken at a few optimizer steps *before* the
update of that step is applied.  Keys look like ``step0000/conv1.weight``.

``steps.npz`` holds the same for a run of consecutive steps (``TRAJECTORY``), for what a codec
does over a sequence of steps under error feedback (``gradcodec demo``, ``roundtrip
--steps``).  Recording them reads no random numbers, so ``sample.npz`` is unchanged by it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

SEED = 1234
BATCH = 64
EPOCHS = 20
LR = 0.05
MOMENTUM = 0.9
HIDDEN = 128
#: the consecutive steps of steps.npz (mid-training: the second quarter's first steps)
TRAJECTORY = range(110, 118)
PARAM_ORDER = (
    "conv1.weight",
    "conv1.bias",
    "conv2.weight",
    "conv2.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
)

# --------------------------------------------------------------------------- layers


def im2col3x3(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N*H*W, C*9) patches of a 3x3, stride-1, padding-1 convolution.

    Column order is (c, kh, kw), matching ``weight.reshape(out, C*9)``.
    """
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, h, w, c, 3, 3), dtype=x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, :, :, i, j] = xp[:, :, i : i + h, j : j + w].transpose(0, 2, 3, 1)
    return cols.reshape(n * h * w, c * 9)


def col2im3x3(dcols: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Adjoint of :func:`im2col3x3`: scatter-add patch gradients back to (N, C, H, W)."""
    n, c, h, w = shape
    d = dcols.reshape(n, h, w, c, 3, 3)
    dxp = np.zeros((n, c, h + 2, w + 2), dtype=dcols.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i : i + h, j : j + w] += d[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1]


def conv_forward(x, w, b):
    n, _, h, wd = x.shape
    cols = im2col3x3(x)
    out = cols @ w.reshape(w.shape[0], -1).T + b  # (N*H*W, O)
    out = out.reshape(n, h, wd, w.shape[0]).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out), cols


def conv_backward(dout, cols, x_shape, w):
    o = w.shape[0]
    d = dout.transpose(0, 2, 3, 1).reshape(-1, o)  # (N*H*W, O)
    dw = (d.T @ cols).reshape(w.shape)
    db = d.sum(axis=0)
    dx = col2im3x3(d @ w.reshape(o, -1), x_shape)
    return dx, dw, db


def maxpool2_forward(x):
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    idx = win.argmax(axis=-1)
    out = np.take_along_axis(win, idx[..., None], axis=-1)[..., 0]
    return out, idx


def maxpool2_backward(dout, idx, x_shape):
    n, c, h, w = x_shape
    dwin = np.zeros((n, c, h // 2, w // 2, 4), dtype=dout.dtype)
    np.put_along_axis(dwin, idx[..., None], dout[..., None], axis=-1)
    return dwin.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h, w)


# --------------------------------------------------------------------------- model


def init_params(rng: np.random.Generator, dtype=np.float32) -> dict[str, np.ndarray]:
    """He-normal weights, zero biases."""

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)

    return {
        "conv1.weight": he((8, 1, 3, 3), 1 * 9),
        "conv1.bias": np.zeros(8, dtype),
        "conv2.weight": he((16, 8, 3, 3), 8 * 9),
        "conv2.bias": np.zeros(16, dtype),
        "fc1.weight": he((HIDDEN, 16 * 4 * 4), 16 * 4 * 4),
        "fc1.bias": np.zeros(HIDDEN, dtype),
        "fc2.weight": he((10, HIDDEN), HIDDEN),
        "fc2.bias": np.zeros(10, dtype),
    }


def forward(p, x, y):
    """Mean softmax cross-entropy loss and the cache needed by :func:`backward`."""
    z1, cols1 = conv_forward(x, p["conv1.weight"], p["conv1.bias"])
    a1 = np.maximum(z1, 0)
    z2, cols2 = conv_forward(a1, p["conv2.weight"], p["conv2.bias"])
    a2 = np.maximum(z2, 0)
    m2, pidx = maxpool2_forward(a2)
    f = m2.reshape(x.shape[0], -1)
    z3 = f @ p["fc1.weight"].T + p["fc1.bias"]
    a3 = np.maximum(z3, 0)
    logits = a3 @ p["fc2.weight"].T + p["fc2.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    logsum = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    logp = shifted - logsum
    loss = -logp[np.arange(len(y)), y].mean()
    cache = (x, z1, cols1, a1, z2, cols2, a2, pidx, f, z3, a3, logp, y)
    return loss, logits, cache


def backward(p, cache) -> dict[str, np.ndarray]:
    x, z1, cols1, a1, z2, cols2, a2, pidx, f, z3, a3, logp, y = cache
    n = x.shape[0]
    g = {}
    dlogits = np.exp(logp)
    dlogits[np.arange(n), y] -= 1
    dlogits /= n
    g["fc2.weight"] = dlogits.T @ a3
    g["fc2.bias"] = dlogits.sum(axis=0)
    da3 = dlogits @ p["fc2.weight"]
    dz3 = da3 * (z3 > 0)
    g["fc1.weight"] = dz3.T @ f
    g["fc1.bias"] = dz3.sum(axis=0)
    df = dz3 @ p["fc1.weight"]
    dm2 = df.reshape(n, 16, 4, 4)
    da2 = maxpool2_backward(dm2, pidx, a2.shape)
    dz2 = da2 * (z2 > 0)
    da1, g["conv2.weight"], g["conv2.bias"] = conv_backward(dz2, cols2, a1.shape, p["conv2.weight"])
    dz1 = da1 * (z1 > 0)
    _, g["conv1.weight"], g["conv1.bias"] = conv_backward(dz1, cols1, x.shape, p["conv1.weight"])
    return {k: g[k] for k in PARAM_ORDER}


def predict(p, x, chunk=512):
    out = []
    for s in range(0, len(x), chunk):
        xb = x[s : s + chunk]
        _, logits, _ = forward(p, xb, np.zeros(len(xb), np.int64))  # labels unused for argmax
        out.append(logits.argmax(axis=1))
    return np.concatenate(out)


# --------------------------------------------------------------------------- gradient check


def gradient_check(x, y, rng, per_tensor=40, eps=1e-6, tol=1e-4) -> float:
    """Compare analytic gradients with central differences in float64; return the worst error.

    For each parameter tensor, up to ``per_tensor`` coordinates (all of them for small
    tensors) are perturbed; the relative error is ``|a - n| / max(|a| + |n|, 1e-8)`` per
    coordinate, and the tensor's error is the maximum over its coordinates.
    """
    p = init_params(rng, np.float64)
    # non-zero biases so that bias gradients are exercised away from the initial point
    for k in p:
        if k.endswith(".bias"):
            p[k] = rng.standard_normal(p[k].shape) * 0.1
    x = x.astype(np.float64)
    _, _, cache = forward(p, x, y)
    grads = backward(p, cache)
    worst = 0.0
    for name in PARAM_ORDER:
        flat = p[name].reshape(-1)
        coords = np.arange(flat.size) if flat.size <= per_tensor else rng.choice(flat.size, per_tensor, replace=False)
        errs = []
        for c in coords:
            old = flat[c]
            flat[c] = old + eps
            lp, _, _ = forward(p, x, y)
            flat[c] = old - eps
            lm, _, _ = forward(p, x, y)
            flat[c] = old
            num = (lp - lm) / (2 * eps)
            ana = grads[name].reshape(-1)[c]
            errs.append(abs(ana - num) / max(abs(ana) + abs(num), 1e-8))
        err = float(max(errs))
        print(f"  gradcheck {name:13s} {len(coords):4d} coords  max rel err {err:.2e}")
        assert err < tol, f"gradient check failed for {name}: relative error {err:.3e} >= {tol}"
        worst = max(worst, err)
    return worst


# --------------------------------------------------------------------------- main


def load_data(rng):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]  # (1797, 1, 8, 8)
    y = d.target.astype(np.int64)
    # stratified 80/20 split, seeded
    train_idx, test_idx = [], []
    for cls in range(10):
        idx = rng.permutation(np.flatnonzero(y == cls))
        k = int(round(0.2 * len(idx)))
        test_idx.append(idx[:k])
        train_idx.append(idx[k:])
    tr = np.sort(np.concatenate(train_idx))
    te = np.sort(np.concatenate(test_idx))
    return x[tr], y[tr], x[te], y[te]


def main(argv=None) -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=root / "codec" / "data" / "sample.npz")
    ap.add_argument("--steps-out", type=Path, default=root / "codec" / "data" / "steps.npz")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    rng = np.random.default_rng(SEED)
    xtr, ytr, xte, yte = load_data(rng)
    print(f"digits: {len(xtr)} train / {len(xte)} test")

    print("gradient check (float64, batch 4):")
    gradient_check(xtr[:4], ytr[:4], np.random.default_rng(SEED + 1))

    p = init_params(rng, np.float32)
    nparams = sum(v.size for v in p.values())
    print(f"parameters: {nparams}")
    vel = {k: np.zeros_like(v) for k, v in p.items()}

    steps_per_epoch = len(xtr) // BATCH  # drop the ragged last batch
    total = EPOCHS * steps_per_epoch
    record = sorted({0, 20, total // 2, total - 1})
    saved: dict[str, np.ndarray] = {}
    trajectory: dict[str, np.ndarray] = {}

    step = 0
    for epoch in range(EPOCHS):
        perm = rng.permutation(len(xtr))
        losses = []
        for b in range(steps_per_epoch):
            bi = perm[b * BATCH : (b + 1) * BATCH]
            loss, _, cache = forward(p, xtr[bi], ytr[bi])
            grads = backward(p, cache)
            losses.append(float(loss))
            if step in record:
                for k in PARAM_ORDER:
                    g = grads[k].astype(np.float32)
                    assert np.isfinite(g).all()
                    saved[f"step{step:04d}/{k}"] = g
            if step in TRAJECTORY:
                for k in PARAM_ORDER:
                    trajectory[f"step{step:04d}/{k}"] = grads[k].astype(np.float32)
            for k in PARAM_ORDER:
                vel[k] = MOMENTUM * vel[k] - LR * grads[k]
                p[k] += vel[k]
            step += 1
        print(f"epoch {epoch + 1:2d}  loss {np.mean(losses):.4f}")

    train_acc = float((predict(p, xtr) == ytr).mean())
    test_acc = float((predict(p, xte) == yte).mean())
    print(f"train accuracy {train_acc:.4f}  test accuracy {test_acc:.4f}")
    assert test_acc > 0.90, f"test accuracy too low: {test_acc}"

    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **saved)
    np.savez_compressed(args.steps_out, **trajectory)
    print(f"wrote {args.steps_out} ({args.steps_out.stat().st_size} bytes, steps {TRAJECTORY.start}..{TRAJECTORY.stop - 1})")
    print(f"recorded steps {record} of {total}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(saved)} tensors)")
    for k, v in saved.items():
        print(f"  {k:28s} {str(v.shape):16s} {v.dtype}")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
