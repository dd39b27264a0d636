"""A bundled sample of real gradients, for the demo, the tests and the benchmarks.

``codec/data/sample.npz`` holds the float32 mini-batch gradients of every parameter of a
small convolutional network trained on scikit-learn's digits dataset (8x8 grey images,
10 classes; 1438 train / 359 test images, stratified, seeded split), taken at four points
of training.  It was produced, in plain NumPy with a hand-written forward/backward pass
that is checked against finite differences before training, by::

    python scripts/make_sample.py

(seed 1234; the script is deterministic on one NumPy build; another build's BLAS rounds the
matrix products differently, about 1e-6 relative, so the committed files are the reference).

Model (35,434 parameters; PyTorch-style shapes):

    =================  ============  =========================================
    key                shape         layer
    =================  ============  =========================================
    ``conv1.weight``   (8, 1, 3, 3)  3x3 conv, padding 1, ReLU
    ``conv1.bias``     (8,)
    ``conv2.weight``   (16, 8, 3, 3) 3x3 conv, padding 1, ReLU, 2x2 max-pool
    ``conv2.bias``     (16,)
    ``fc1.weight``     (128, 256)    fully connected, ReLU
    ``fc1.bias``       (128,)
    ``fc2.weight``     (10, 128)     fully connected, softmax cross-entropy
    ``fc2.bias``       (10,)
    =================  ============  =========================================

Training: SGD, momentum 0.9, learning rate 0.05, batch 64, 20 epochs (440 steps), float32;
final train accuracy 100.0 %, test accuracy 99.2 %.

Recorded steps: 0 (initialization), 20 (early), 220 (mid), 439 (last).  Each gradient is
the gradient of the mean loss over that step's batch of 64, taken before the step's update.
Keys are ``stepNNNN/<layer>.<param>``, e.g. ``step0000/conv1.weight``; 32 tensors, every
one float32.  Gradients shrink by about two orders of magnitude from step 0 to the last
step, and are heavy-tailed (the fc weight gradients have kurtosis well above 3, with many
exact zeros from dead ReLU units).

``codec/data/steps.npz`` (:func:`load_steps`) holds the same tensors at eight consecutive
steps of that run, 110 to 117 (early in the second quarter of training, momentum
established): what a codec does over a sequence of steps under error feedback, for
``gradcodec demo`` and ``gradcodec roundtrip --steps``.

>>> from codec.sample import load_sample
>>> grads = load_sample()
>>> grads["step0000/conv2.weight"].shape
(16, 8, 3, 3)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["load_sample", "load_steps", "sample_path"]

_FILENAME = "sample.npz"


def sample_path() -> Path:
    """Path of the bundled ``sample.npz`` (inside the installed ``codec`` package)."""
    return Path(__file__).resolve().parent / "data" / _FILENAME


def load_sample() -> dict[str, np.ndarray]:
    """All gradients of the sample, ``{"stepNNNN/layer.param": float32 array}``, in stored order."""
    with np.load(sample_path(), allow_pickle=False) as z:
        return {name: np.asarray(z[name], dtype=np.float32) for name in z.files}


def load_steps() -> list[dict[str, np.ndarray]]:
    """The eight consecutive steps of ``steps.npz``, in order: one ``{"layer.param": float32
    array}`` a step (the same names and shapes as the sample's)."""
    path = sample_path().with_name("steps.npz")
    steps: dict[str, dict] = {}
    with np.load(path, allow_pickle=False) as z:
        for name in z.files:
            step, param = name.split("/", 1)
            steps.setdefault(step, {})[param] = np.asarray(z[name], dtype=np.float32)
    return [steps[k] for k in sorted(steps)]
