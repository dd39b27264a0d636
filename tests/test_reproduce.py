"""The training reproductions' driver (scripts/reproduce.py) end to end on its smoke set: a CNN
on scikit-learn's digits, 2 ranks under mpiexec, uncompressed, top-k(1%) and Pufferfish's
factorized model for a few steps; then the report's table and figures from the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("mpi4py")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "reproduce.py"


def test_the_smoke_set_runs_and_reports(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "run", "--set", "smoke", "--out", str(tmp_path), "--timeout", "300"],
                         capture_output=True, text=True, timeout=360)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    runs = {r["config"]: r for r in json.loads((tmp_path / "smoke" / "cnn.json").read_text())}
    assert set(runs) == {"dense", "topk-1%", "pufferfish"}
    dense, topk, puff = runs["dense"], runs["topk-1%"], runs["pufferfish"]
    assert dense["bytes_sent_per_step"] == dense["dense_bytes_per_step"]  # none: MPI Allreduce of the float32 gradients
    assert topk["bytes_sent_per_step"] < dense["bytes_sent_per_step"] / 50  # 1% of the values with their positions, headers included
    assert set(topk["bytes_by_layer_type"]) == {"conv", "fc"} and puff["params"] < dense["params"] / 2
    assert all(0.0 <= r["metric"] <= 1.0 and r["loss"] and r["evals"][-1][0] == r["steps"] for r in runs.values())
    img = tmp_path / "img"
    rep = subprocess.run([sys.executable, str(SCRIPT), "report", "--set", "smoke", "--out", str(tmp_path), "--img", str(img)],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert "| topk-1% | `topk` |" in rep.stdout and "params" in rep.stdout
    assert {p.name for p in img.glob("*.png")} == {"evidence-cnn-bytes.png", "evidence-cnn-loss.png", "evidence-layer-types.png"}
