"""transport.costmodel: the alpha-beta formulas of docs/transport.md, checked on hand-worked values."""

import math

import pytest

from transport import costmodel as cm

LINK = cm.Link(alpha=1e-5, bandwidth=8e9)  # beta = 1e-9 s per byte


def test_beta_is_seconds_per_byte():
    assert LINK.beta == pytest.approx(1e-9)


@pytest.mark.parametrize("p", [1, 2, 3, 8, 1024])
def test_ring_allreduce_and_allgather(p):
    d = 1e8
    want = 0.0 if p == 1 else 2 * (p - 1) * 1e-5 + 2 * (p - 1) / p * d * 1e-9
    assert cm.ring_allreduce(p, d, LINK) == pytest.approx(want)
    s = 1e5
    assert cm.ring_allgather(p, s, LINK) == pytest.approx(0.0 if p == 1 else (p - 1) * (1e-5 + s * 1e-9))


@pytest.mark.parametrize("p,rounds", [(1, 0), (2, 1), (3, 3), (4, 2), (5, 4), (8, 3), (12, 5), (1024, 10)])
def test_tree_rounds_add_fold_and_unfold_off_powers_of_two(p, rounds):
    assert cm.tree_rounds(p) == rounds
    assert cm.gtopk(p, 1000, LINK) == pytest.approx(rounds * (1e-5 + 8000 * 1e-9))


def test_schemes_add_measured_compute():
    ag = cm.Scheme("topk", "allgather", 1e5, encode_s=0.01, decode_s=0.001)
    assert ag.step_s(8, LINK) == pytest.approx(cm.ring_allgather(8, 1e5, LINK) + 0.01 + 8 * 0.001)
    gt = cm.Scheme("gtopk", "gtopk", 8e3, k=1000, encode_s=0.01, decode_s=0.002)
    assert gt.step_s(8, LINK) == pytest.approx(cm.gtopk(8, 1000, LINK) + 0.01 + 3 * 0.002)
    ps = cm.Scheme("powersgd", "powersgd", 4e4, q_bytes=2e4, encode_s=0.003, decode_s=0.004)
    assert ps.step_s(4, LINK) == pytest.approx(cm.ring_allreduce(4, 4e4, LINK) + cm.ring_allreduce(4, 2e4, LINK) + 0.007)
    with pytest.raises(ValueError, match="kind"):
        cm.Scheme("x", "bogus", 1.0).comm_s(2, LINK)


def test_projection_covers_every_link_and_rank_count():
    rows = cm.projection([cm.Scheme("none", "allreduce", 1e8), cm.Scheme("gtopk", "gtopk", 2e5, k=25000)])
    assert [(r[0], r[1]) for r in rows] == [(name, p) for name, _, _ in cm.LINKS for p in cm.RANKS]
    slow = [r for r in rows if r[0] == "1 Gbit/s" and r[1] == 1024][0][2]
    assert slow["gtopk"] < slow["none"]  # bandwidth-bound: the tree wins
    assert math.isfinite(slow["none"])
