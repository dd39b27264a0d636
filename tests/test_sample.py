"""The bundled sample of real gradients (codec/data/sample.npz, made by scripts/make_sample.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codec.sample import load_sample, sample_path

KEY = re.compile(r"^step(\d{4})/([a-z][a-z0-9_]*)\.(weight|bias)$")


@pytest.fixture(scope="module")
def sample():
    return load_sample()


def _kurtosis(a: np.ndarray) -> float:
    x = a.astype(np.float64).ravel()
    x = x - x.mean()
    return float((x**4).mean() / (x**2).mean() ** 2)


def _step_norm(sample, step: int) -> float:
    prefix = f"step{step:04d}/"
    return float(np.sqrt(sum(np.sum(a.astype(np.float64) ** 2) for k, a in sample.items() if k.startswith(prefix))))


def _steps(sample):
    return sorted({int(KEY.match(k).group(1)) for k in sample})


def test_file_exists_and_small():
    p = sample_path()
    assert p.is_file()
    assert p.suffix == ".npz"
    assert p.stat().st_size <= 3 * 1024 * 1024


def test_loads_as_dict_of_float32(sample):
    assert isinstance(sample, dict)
    assert len(sample) >= 8
    for name, a in sample.items():
        assert isinstance(a, np.ndarray), name
        assert a.dtype == np.float32, name
        assert a.size > 0, name


def test_order_is_stored_order(sample):
    with np.load(sample_path()) as z:
        assert list(sample) == list(z.files)


def test_finite_and_nonzero(sample):
    for name, a in sample.items():
        assert np.isfinite(a).all(), name
        assert np.any(a != 0), name


def test_key_names(sample):
    for name in sample:
        assert KEY.match(name), name


def test_every_step_has_the_same_parameters(sample):
    by_step: dict[int, dict[str, tuple]] = {}
    for name, a in sample.items():
        m = KEY.match(name)
        by_step.setdefault(int(m.group(1)), {})[f"{m.group(2)}.{m.group(3)}"] = a.shape
    assert len(by_step) >= 3
    layouts = list(by_step.values())
    assert all(lay == layouts[0] for lay in layouts)
    # every weight has its bias, of matching output size
    for pname, shape in layouts[0].items():
        if pname.endswith(".weight"):
            bias = pname[: -len("weight")] + "bias"
            assert bias in layouts[0]
            assert layouts[0][bias] == (shape[0],)


def test_has_conv_and_fc_weights(sample):
    weights = {k: a for k, a in sample.items() if k.endswith(".weight")}
    conv = [a for a in weights.values() if a.ndim >= 3]
    fc = [a for a in weights.values() if a.ndim == 2]
    assert conv, "no conv weights"
    assert fc, "no fc weights"
    assert all(a.ndim == 4 for a in conv)
    for k, a in sample.items():
        if k.endswith(".bias"):
            assert a.ndim == 1, k
    total = sum(a.size for k, a in sample.items() if k.startswith(f"step{_steps(sample)[0]:04d}/"))
    assert 20_000 <= total <= 80_000


def test_heavy_tailed(sample):
    kurt = {k: _kurtosis(a) for k, a in sample.items() if k.endswith(".weight") and a.ndim >= 2}
    assert max(kurt.values()) > 3.0, kurt


def test_first_and_last_step_differ(sample):
    steps = _steps(sample)
    first, last = steps[0], steps[-1]
    assert first != last
    for name, a in sample.items():
        if not name.startswith(f"step{first:04d}/"):
            continue
        b = sample[f"step{last:04d}/" + name.split("/", 1)[1]]
        assert a.shape == b.shape
        assert not np.array_equal(a, b), name
    # training converges: the last gradients are much smaller than the first ones
    assert _step_norm(sample, last) < 0.5 * _step_norm(sample, first)


def test_fresh_copies(sample):
    a = load_sample()
    b = load_sample()
    k = next(iter(a))
    a[k][...] = 0
    assert np.any(b[k] != 0)


def test_the_consecutive_steps(sample):
    """steps.npz: 8 steps of the same 8 tensors (the sample's names and shapes), finite, each
    step its own mini-batch's gradient: consecutive steps differ (cosines from -0.4 to 0.74)
    and on average point the same way."""
    from codec.sample import load_steps

    steps = load_steps()
    names = {k.split("/", 1)[1]: a.shape for k, a in sample.items() if k.startswith("step0000/")}
    assert len(steps) == 8 and all({k: a.shape for k, a in s.items()} == names for s in steps)
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for s in steps for a in s.values())
    flat = [np.concatenate([s[k].ravel() for k in names]).astype(np.float64) for s in steps]
    cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(flat, flat[1:])]
    assert all(abs(c) < 0.99 for c in cos) and np.mean(cos) > 0.1, cos
