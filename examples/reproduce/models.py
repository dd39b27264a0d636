"""The three model families of the training reproductions (docs/evidence.md), each on data that
ships offline in a registry package, nothing downloaded:

* ``cnn``: a CNN (two 3x3 convolutions, two fully connected layers) on scikit-learn's bundled
  digits (8x8 images, 10 classes); metric: test accuracy.
* ``mlp``: an FC-heavy network (three hidden layers of 512) on MNIST-1D, which the ``mnist1d``
  package generates from code (40-sample signals, 10 classes); metric: test accuracy.
* ``lstm``: a character-level LSTM language model on the help text that ships with Python
  (``pydoc_data.topics``, about 0.7 MB of English); metric: test bits per character (lower
  is better).

``make(name, factorized=False)`` builds a model (``factorized``: Pufferfish's low-rank layers,
chosen by ``codec.lowrank.plan``), ``factorize_from(model, name)`` switches a trained dense
model to them (Pufferfish's vanilla warm-up); ``Data(name, rank, size, seed)`` serves each rank its shard
of every global batch; ``layer_type(model)`` maps each parameter to ``conv``, ``fc`` or
``recurrent`` (embedding and LSTM) for the bytes-per-layer-type tables.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

__all__ = ["MODELS", "Data", "factorize_from", "layer_type", "make", "metric"]

#: per model: the global batch, the optimizer's learning rate, whether the metric is higher-better
MODELS = {
    "cnn": {"batch": 64, "lr": 0.05, "higher": True, "metric": "test accuracy"},
    "mlp": {"batch": 64, "lr": 0.05, "higher": True, "metric": "test accuracy"},
    "lstm": {"batch": 32, "lr": 0.5, "higher": False, "metric": "test bits per character"},
}
SEQ = 64  # the LSTM's characters per sequence


# ---------------------------------------------------------------------------------- data
def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(1234).permutation(len(y))  # one fixed split for every seed
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def _mnist1d():
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = 5000, 42
    d = make_dataset(args)
    mean, std = d["x"].mean(), d["x"].std()
    f = lambda a: ((a - mean) / std).astype(np.float32)  # noqa: E731
    return f(d["x"]), d["y"].astype(np.int64), f(d["x_test"]), d["y_test"].astype(np.int64)


def _text():
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    codes = np.frombuffer(text.encode("ascii", "replace"), np.uint8).copy()
    codes[(codes < 32) & (codes != 10)] = 63  # control characters as '?'
    vocab = np.unique(codes)
    ids = np.searchsorted(vocab, codes).astype(np.int64)
    cut = int(0.9 * len(ids))
    return ids[:cut], ids[cut:], len(vocab)


class Data:
    """Rank ``rank``'s share of every global batch (``MODELS[name]["batch"]`` examples, split
    evenly over ``size`` ranks), drawn with ``seed``; ``test()`` is the whole test set."""

    def __init__(self, name: str, rank: int, size: int, seed: int):
        self.name, self.rank, self.size = name, rank, size
        self.rng = np.random.default_rng(seed)
        self.local = MODELS[name]["batch"] // size
        if name == "lstm":
            self.train, self.test_ids, self.vocab = _text()
        else:
            self.x, self.y, self.xt, self.yt = _digits() if name == "cnn" else _mnist1d()

    def batch(self):
        """This rank's examples of the next global batch (every rank draws the same global
        batch and takes its own slice)."""
        lo, hi = self.rank * self.local, (self.rank + 1) * self.local
        if self.name == "lstm":
            starts = self.rng.integers(0, len(self.train) - SEQ - 1, self.local * self.size)[lo:hi]
            seq = np.stack([self.train[s : s + SEQ + 1] for s in starts])
            return torch.from_numpy(seq[:, :-1]), torch.from_numpy(seq[:, 1:])
        idx = self.rng.integers(0, len(self.y), self.local * self.size)[lo:hi]
        return torch.from_numpy(self.x[idx]), torch.from_numpy(self.y[idx])

    def test(self):
        if self.name == "lstm":
            n = (len(self.test_ids) - 1) // SEQ
            seq = self.test_ids[: n * SEQ + 1]
            x = torch.from_numpy(seq[:-1].reshape(n, SEQ))
            y = torch.from_numpy(seq[1:].reshape(n, SEQ))
            return x, y
        return torch.from_numpy(self.xt), torch.from_numpy(self.yt)


# ---------------------------------------------------------------------------------- models
class LowRankLinear(nn.Sequential):
    """Pufferfish's factorized linear layer: ``in -> rank -> out``."""

    def __init__(self, n_in: int, n_out: int, rank: int):
        super().__init__(nn.Linear(n_in, rank, bias=False), nn.Linear(rank, n_out))


class LowRankConv(nn.Sequential):
    """Pufferfish's factorized convolution: a k x k convolution to ``rank`` channels, then a
    1 x 1 convolution to ``out``."""

    def __init__(self, c_in: int, c_out: int, rank: int, k: int):
        super().__init__(nn.Conv2d(c_in, rank, k, padding=k // 2, bias=False), nn.Conv2d(rank, c_out, 1))


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, emb: int = 48, hidden: int = 192):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.head(h)


def make(name: str, factorized: bool = False, vocab: int = 0) -> nn.Module:
    """The model ``name`` (seeded by the caller's ``torch.manual_seed``); ``factorized``:
    the layers ``codec.lowrank.plan`` factorizes (rank ratio 1/4; first and last layers full)
    become Pufferfish's two low-rank layers."""
    if name == "lstm":
        if factorized:
            raise ValueError("factorized: the LSTM stays dense (Pufferfish's policy keeps its gates full rank here)")
        return CharLSTM(vocab)
    if name == "cnn":
        layers = [("conv", 1, 16, 3), ("conv", 16, 32, 3), ("pool",), ("flat",), ("fc", 32 * 4 * 4, 128), ("fc", 128, 10)]
    else:
        layers = [("fc", 40, 512), ("fc", 512, 512), ("fc", 512, 512), ("fc", 512, 10)]
    ranks = {}
    if factorized:
        from codec.lowrank import plan

        shapes = [(spec[2], spec[1], spec[3], spec[3]) if spec[0] == "conv" else (spec[2], spec[1]) for spec in layers if spec[0] in ("conv", "fc")]
        ranks = {i: layer.rank for i, layer in enumerate(plan(shapes, min_size=1024).layers) if layer.rank}
    mods, w = [], 0
    for spec in layers:
        if spec[0] in ("conv", "fc"):
            r = ranks.get(w)
            if spec[0] == "conv":
                mods.append(LowRankConv(spec[1], spec[2], r, spec[3]) if r else nn.Conv2d(spec[1], spec[2], spec[3], padding=1))
            else:
                mods.append(LowRankLinear(spec[1], spec[2], r) if r else nn.Linear(spec[1], spec[2]))
            w += 1
            if w < sum(s[0] in ("conv", "fc") for s in layers):
                mods.append(nn.ReLU())
        elif spec[0] == "pool":
            mods.append(nn.MaxPool2d(2))
        else:
            mods.append(nn.Flatten())
    return nn.Sequential(*mods)


@torch.no_grad()
def factorize_from(model: nn.Module, name: str) -> nn.Module:
    """Pufferfish's switch after its vanilla warm-up: the factorized model of ``name`` whose
    low-rank layers start from the truncated SVD of ``model``'s trained weights
    (``codec.lowrank.factorize``, at the ranks ``make(factorized=True)`` chose); every other
    parameter is copied."""
    from codec.lowrank import factorize

    out = make(name, factorized=True)
    for dense, fact in zip(model, out):
        if isinstance(fact, (LowRankLinear, LowRankConv)):
            f = factorize(dense.weight.numpy(), rank=fact[0].weight.shape[0])
            fact[0].weight.copy_(torch.from_numpy(f.first))
            fact[1].weight.copy_(torch.from_numpy(f.second).reshape(fact[1].weight.shape))
            fact[1].bias.copy_(dense.bias)
        else:
            fact.load_state_dict(dense.state_dict())
    return out


def layer_type(model: nn.Module) -> dict:
    """``{parameter name: "conv" | "fc" | "recurrent"}`` (embedding and LSTM are recurrent)."""
    kinds = {}
    for mname, mod in model.named_modules():
        kind = "conv" if isinstance(mod, nn.Conv2d) else "fc" if isinstance(mod, nn.Linear) else \
            "recurrent" if isinstance(mod, (nn.LSTM, nn.Embedding)) else None
        if kind:
            for pname, _ in mod.named_parameters(recurse=False):
                kinds[f"{mname}.{pname}" if mname else pname] = kind
    return kinds


@torch.no_grad()
def metric(name: str, model: nn.Module, data: Data) -> float:
    """The test metric: accuracy, or bits per character for the LSTM."""
    model.eval()
    x, y = data.test()
    if name == "lstm":
        total = 0.0
        for i in range(0, len(x), 64):
            out = model(x[i : i + 64])
            total += float(nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y[i : i + 64].reshape(-1), reduction="sum"))
        value = total / y.numel() / math.log(2)
    else:
        value = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return value
