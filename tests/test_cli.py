"""The gradcodec command line: every command in-process through main(), plus one real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import codec
import codec.sample
from codec.cli import main
from codec.container import is_container, pack_frames, unpack_frames
from codec.dtypes import bfloat16
from codec.io import read_tensors, write_tensors

DTYPES = [np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64)]
LOSSLESS = ["none", "none+zstd", "zstd(level=1)+crc32"]


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def fails(capsys, code, *argv) -> str:
    """Run, expect exit ``code`` and exactly one 'gradcodec: error:' line on stderr; return it."""
    rc, out, err = run(capsys, *argv)
    assert rc == code, (rc, out, err)
    assert err.startswith("gradcodec: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "step0000/conv1.weight": rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.01,
        "fc.bias": rng.standard_normal(10).astype(np.float32),
        "half": rng.standard_normal((4, 5)).astype(np.float16),
        "brain": rng.standard_normal(33).astype(np.float32).astype(bfloat16),
        "double": rng.standard_normal((2, 2, 2)),
        "empty": np.zeros((0, 3), np.float32),
    }


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture
def small_sample(monkeypatch):
    """A fast stand-in for the bundled sample (the real one is exercised once, below)."""
    rng = np.random.default_rng(7)
    fake = {f"step{s:04d}/{k}": (rng.standard_normal(shape) * scale).astype(np.float32)
            for s, scale in ((0, 1e-2), (9, 1e-4)) for k, shape in (("w", (16, 8)), ("b", (16,)))}
    monkeypatch.setattr(codec.sample, "load_sample", lambda: {k: v.copy() for k, v in fake.items()})
    return fake


# ------------------------------------------------------------------ help, version, list
def test_help_and_version(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for cmd in ("list", "encode", "decode", "info", "roundtrip", "demo"):
        assert cmd in out
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"gradcodec {codec.__version__}"
    rc, out, _ = run(capsys, "encode", "--help")
    assert rc == 0 and "SPEC" in out


def test_list(capsys):
    rc, out, _ = run(capsys, "list")
    assert rc == 0
    for c in codec.list_codecs():
        assert c["id"] in out
    assert "level=3" in out
    rc, out, _ = run(capsys, "list", "--json")
    assert rc == 0
    assert json.loads(out) == json.loads(json.dumps(codec.list_codecs()))


# ------------------------------------------------------------------ encode / decode
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4)], ids=str)
@pytest.mark.parametrize("spec", LOSSLESS)
def test_single_tensor_lossless_round_trip(capsys, tmp_path, dtype, shape, spec):
    x = (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / 7 - 1).astype(dtype)
    write_tensors(tmp_path / "g.npy", {"g": x})
    rc, out, _ = run(capsys, "encode", spec, tmp_path / "g.npy", "-o", tmp_path / "g.gcf")
    assert rc == 0 and "frame" in out and "ratio" in out
    frame = (tmp_path / "g.gcf").read_bytes()
    assert not is_container(frame)
    assert same(codec.decode(frame), x)
    for ext in (".npy", ".npz", ".safetensors"):
        rc, out, _ = run(capsys, "decode", tmp_path / "g.gcf", "-o", tmp_path / f"back{ext}")
        assert rc == 0
        (y,) = read_tensors(tmp_path / f"back{ext}").values()
        assert same(y, x)


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
@pytest.mark.parametrize("spec", ["none+zstd", "crc32"])
def test_multi_tensor_container_round_trip(capsys, tmp_path, ext, spec):
    xs = tensors()
    write_tensors(tmp_path / f"in{ext}", xs)
    rc, out, _ = run(capsys, "encode", spec, tmp_path / f"in{ext}", "-o", tmp_path / "out.gcc")
    assert rc == 0 and "container" in out and f"{len(xs)} tensors" in out
    buf = (tmp_path / "out.gcc").read_bytes()
    assert is_container(buf)
    assert [n for n, _ in unpack_frames(buf)] == list(xs)
    for out_ext in (".npz", ".safetensors"):
        rc, _, _ = run(capsys, "decode", tmp_path / "out.gcc", "-o", tmp_path / f"back{out_ext}")
        assert rc == 0
        back = read_tensors(tmp_path / f"back{out_ext}")
        assert set(back) == set(xs)
        for k in xs:
            assert same(back[k], xs[k]), k
    fails(capsys, 2, "decode", tmp_path / "out.gcc", "-o", tmp_path / "back.npy")


def test_lossy_round_trip_and_single_entry_container(capsys, tmp_path):
    x = tensors()["step0000/conv1.weight"]
    write_tensors(tmp_path / "w.npz", {"my.weight": x})
    assert run(capsys, "encode", "fp16+zstd", tmp_path / "w.npz", "-o", tmp_path / "w.gcf")[0] == 0
    y = codec.decode((tmp_path / "w.gcf").read_bytes())
    np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-7)
    # --container keeps the name, and a one-entry container decodes to .npy
    assert run(capsys, "encode", "fp16", tmp_path / "w.npz", "-o", tmp_path / "w.gcc", "--container")[0] == 0
    assert [n for n, _ in unpack_frames((tmp_path / "w.gcc").read_bytes())] == ["my.weight"]
    assert run(capsys, "decode", tmp_path / "w.gcc", "-o", tmp_path / "w.npy")[0] == 0
    assert run(capsys, "decode", tmp_path / "w.gcc", "-o", tmp_path / "w2.npz")[0] == 0
    assert list(read_tensors(tmp_path / "w2.npz")) == ["my.weight"]


def test_single_frame_to_npz_is_named_by_frame_file(capsys, tmp_path):
    write_tensors(tmp_path / "g.npy", {"g": np.ones(3, np.float32)})
    run(capsys, "encode", "none", tmp_path / "g.npy", "-o", tmp_path / "grad7.gcf")
    assert run(capsys, "decode", tmp_path / "grad7.gcf", "-o", tmp_path / "o.npz")[0] == 0
    assert list(read_tensors(tmp_path / "o.npz")) == ["grad7"]


def test_empty_npz_gives_empty_container(capsys, tmp_path):
    write_tensors(tmp_path / "e.npz", {})
    assert run(capsys, "encode", "fp16", tmp_path / "e.npz", "-o", tmp_path / "e.gcc")[0] == 0
    assert unpack_frames((tmp_path / "e.gcc").read_bytes()) == []
    assert run(capsys, "decode", tmp_path / "e.gcc", "-o", tmp_path / "e2.npz")[0] == 0
    assert read_tensors(tmp_path / "e2.npz") == {}


# ------------------------------------------------------------------ info
def test_info_frame(capsys, tmp_path):
    frame = codec.get_codec("fp16+zstd").encode(np.linspace(0, 1, 1000, dtype=np.float32).reshape(10, 100))
    (tmp_path / "f.gcf").write_bytes(frame)
    rc, out, _ = run(capsys, "info", tmp_path / "f.gcf")
    assert rc == 0
    for text in ("fp16+zstd", "float32", "(10, 100)", "1,000", "4,000", "values", "sections"):
        assert text in out, text
    rc, out, _ = run(capsys, "info", tmp_path / "f.gcf", "--json")
    d = json.loads(out)
    assert {k: v for k, v in d.items() if k != "raw_bytes"} == codec.inspect(frame)
    assert d["raw_bytes"] == 4000


def test_info_container(capsys, tmp_path):
    xs = tensors()
    write_tensors(tmp_path / "in.safetensors", xs)
    run(capsys, "encode", "bf16", tmp_path / "in.safetensors", "-o", tmp_path / "c.gcc")
    rc, out, _ = run(capsys, "info", tmp_path / "c.gcc")
    assert rc == 0
    for name in xs:
        assert name in out
    assert "TOTAL" in out and "bfloat16" in out
    rc, out, _ = run(capsys, "info", tmp_path / "c.gcc", "--json")
    d = json.loads(out)
    size = (tmp_path / "c.gcc").stat().st_size
    assert d["container"]["count"] == len(xs) and d["container"]["container_bytes"] == size
    assert d["container"]["header_bytes"] + sum(t["frame_bytes"] for t in d["tensors"]) == size
    assert [t["name"] for t in d["tensors"]] == list(xs)
    assert d["container"]["raw_bytes"] == sum(x.nbytes for x in xs.values())


# ------------------------------------------------------------------ roundtrip
def test_roundtrip_json(capsys, tmp_path):
    xs = tensors()
    write_tensors(tmp_path / "in.npz", xs)
    rc, out, _ = run(capsys, "roundtrip", "none+zstd", tmp_path / "in.npz", "--json", "--repeat", "1")
    assert rc == 0
    d = json.loads(out)
    assert d["codec"] == "none+zstd" and d["lossless"] is True
    assert [r["name"] for r in d["rows"]] == list(xs)
    c = codec.get_codec("none+zstd")
    for r in d["rows"]:
        x = xs[r["name"]]
        assert r["elements"] == x.size and r["bytes_in"] == x.nbytes
        assert r["bytes_out"] == len(c.encode(x))
        assert r["rel_l2_error"] == 0 and r["max_abs_error"] == 0 and r["cosine"] == pytest.approx(1)
        assert r["ratio"] == pytest.approx(r["bytes_in"] / r["bytes_out"])
        assert r["encode_gbps"] > 0 and r["decode_gbps"] > 0 or x.size == 0
    t = d["total"]
    assert t["bytes_in"] == sum(r["bytes_in"] for r in d["rows"])
    assert t["ratio"] == pytest.approx(t["bytes_in"] / sum(r["bytes_out"] for r in d["rows"]))


def test_roundtrip_lossy_errors(capsys, tmp_path):
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    write_tensors(tmp_path / "x.npy", {"x": x})
    rc, out, _ = run(capsys, "roundtrip", "fp16", tmp_path / "x.npy", "--json", "--repeat", "1")
    r = json.loads(out)["rows"][0]
    y = codec.decode(codec.get_codec("fp16").encode(x)).astype(np.float64)
    xd = x.astype(np.float64)
    assert r["rel_l2_error"] == pytest.approx(np.linalg.norm(y - xd) / np.linalg.norm(xd))
    assert r["cosine"] == pytest.approx(xd @ y / np.linalg.norm(xd) / np.linalg.norm(y))
    assert r["max_abs_error"] == pytest.approx(np.abs(y - xd).max())
    assert 0 < r["rel_l2_error"] < 1e-3
    # zero input: relative error 0, cosine 1
    write_tensors(tmp_path / "z.npy", {"z": np.zeros(8, np.float32)})
    rc, out, _ = run(capsys, "roundtrip", "fp16", tmp_path / "z.npy", "--json", "--repeat", "1")
    r = json.loads(out)["total"]
    assert r["rel_l2_error"] == 0 and r["cosine"] == 1


def test_roundtrip_table(capsys, tmp_path):
    write_tensors(tmp_path / "in.safetensors", tensors())
    rc, out, _ = run(capsys, "roundtrip", "threshold(value=0.001)+fp16+zstd", tmp_path / "in.safetensors", "--repeat", "1")
    assert rc == 0
    assert "TOTAL" in out and "step0000/conv1.weight" in out and "rel L2 err" in out and "enc GB/s" in out


# ------------------------------------------------------------------ demo
def test_demo_default_set(capsys, small_sample):
    """Every registered codec heads a row, grouped by family; each row has the one-step and
    the 8-step numbers; the table carries the legend."""
    rc, out, _ = run(capsys, "demo", "--json", "--repeat", "1")
    assert rc == 0
    d = json.loads(out)
    rows = d["rows"]
    heads = {codec.parse_spec(r["name"])[0][0] for r in rows} | {s[0] for r in rows for s in codec.parse_spec(r["name"])}
    assert {c["id"] for c in codec.list_codecs()} <= heads
    assert [r["family"] for r in rows][:3] == ["lossless"] * 3 and len({r["family"] for r in rows}) >= 6
    assert "threshold" not in [r["name"] for r in rows]  # (its default keeps everything: shown at a value)
    total_bytes = sum(x.nbytes for x in small_sample.values())
    for r in rows:
        assert "error" not in r, r
        assert r["tensors"] == len(small_sample) and r["bytes_in"] == total_bytes
        if r["lossless"]:
            assert r["rel_l2_error"] == 0 and r["steps_error_ef"] == 0 == r["steps_error"]
        else:
            assert 0 < r["steps_error_ef"] and 0 < r["steps_error"]
    by = {r["name"]: r for r in rows}
    assert by["topk"]["steps_error_ef"] < by["topk"]["steps_error"] < 1  # error feedback catches up on what top-k dropped
    assert by["sign"]["direction_only"] and not by["efsign"]["direction_only"]
    assert d["sample"]["bytes"] == total_bytes and d["sample"]["steps"] == 8
    rc, out, _ = run(capsys, "demo", "--repeat", "1")
    assert rc == 0 and "gradcodec demo" in out and "fp16+zstd" in out and "sparsifiers" in out and "8 steps, EF" in out
    assert "error feedback" in out and "direction only" in out


def test_demo_codecs_option(capsys, small_sample):
    rc, out, _ = run(capsys, "demo", "--json", "--repeat", "1", "--codecs", "fp16, threshold(value=0.001)+fp16+zstd,zstd(level=1)")
    assert rc == 0
    assert [r["name"] for r in json.loads(out)["rows"]] == ["fp16", "threshold(value=0.001)+fp16+zstd", "none+zstd(level=1)"]
    fails(capsys, 2, "demo", "--codecs", "fp16,nosuchcodec")
    fails(capsys, 2, "demo", "--codecs", " , ")
    fails(capsys, 2, "demo", "--codecs", "fp16(", "--repeat", "1")


def test_demo_on_the_real_sample(capsys):
    grads = codec.sample.load_sample()
    rc, out, _ = run(capsys, "demo", "--json", "--repeat", "1", "--codecs", "fp16+zstd")
    assert rc == 0
    (row,) = json.loads(out)["rows"]
    assert row["elements"] == sum(x.size for x in grads.values())
    assert row["ratio"] > 1.5 and row["rel_l2_error"] < 1e-3


# ------------------------------------------------------------------ errors
def test_usage_errors(capsys, tmp_path):
    write_tensors(tmp_path / "x.npy", {"x": np.ones(4, np.float32)})
    x = tmp_path / "x.npy"
    fails(capsys, 2)  # no command
    fails(capsys, 2, "nosuchcommand")
    fails(capsys, 2, "encode", "fp16", x)  # -o missing
    fails(capsys, 2, "list", "--bogus")
    assert "nosuch" in fails(capsys, 2, "encode", "nosuch", x, "-o", tmp_path / "o")  # unknown codec
    fails(capsys, 2, "encode", "fp16(", x, "-o", tmp_path / "o")  # bad spec syntax
    fails(capsys, 2, "encode", "fp16(bits=3)", x, "-o", tmp_path / "o")  # unknown parameter
    fails(capsys, 2, "encode", "zstd(level=99)", x, "-o", tmp_path / "o")  # out of range
    fails(capsys, 2, "roundtrip", "fp16", x, "--repeat", "0")
    assert ".safetensors" in fails(capsys, 2, "encode", "fp16", tmp_path / "x.pt", "-o", tmp_path / "o")
    run(capsys, "encode", "fp16", x, "-o", tmp_path / "x.gcf")
    fails(capsys, 2, "decode", tmp_path / "x.gcf", "-o", tmp_path / "x.txt")
    assert not (tmp_path / "o").exists()


def test_data_errors(capsys, tmp_path):
    fails(capsys, 1, "encode", "fp16", tmp_path / "missing.npy", "-o", tmp_path / "o")
    fails(capsys, 1, "info", tmp_path / "missing.gcf")
    fails(capsys, 1, "decode", tmp_path / "missing.gcf", "-o", tmp_path / "o.npy")
    (tmp_path / "junk.gcf").write_bytes(b"this is not a frame at all")
    assert "not a gradcodec frame" in fails(capsys, 1, "info", tmp_path / "junk.gcf")
    fails(capsys, 1, "decode", tmp_path / "junk.gcf", "-o", tmp_path / "o.npy")
    (tmp_path / "empty.gcf").write_bytes(b"")
    fails(capsys, 1, "info", tmp_path / "empty.gcf")
    np.savez(tmp_path / "ints.npz", w=np.ones(2, np.float32), counts=np.arange(3))
    assert "counts" in fails(capsys, 1, "encode", "fp16", tmp_path / "ints.npz", "-o", tmp_path / "o")
    write_tensors(tmp_path / "nan.npz", {"ok": np.ones(2, np.float32), "bad": np.array([1, np.nan], np.float32)})
    assert "'bad'" in fails(capsys, 1, "encode", "fp16", tmp_path / "nan.npz", "-o", tmp_path / "o")
    assert not (tmp_path / "o").exists()
    fails(capsys, 1, "encode", "fp16", tmp_path / "nan.npz", "-o", tmp_path / "no" / "such" / "dir" / "o")
    (tmp_path / "dir.npy").mkdir()
    fails(capsys, 1, "encode", "fp16", tmp_path / "dir.npy", "-o", tmp_path / "o")


def test_corrupt_container_and_frames(capsys, tmp_path):
    write_tensors(tmp_path / "in.npz", tensors())
    run(capsys, "encode", "none+zstd", tmp_path / "in.npz", "-o", tmp_path / "c.gcc")
    buf = (tmp_path / "c.gcc").read_bytes()
    for n in (3, 10, 40, len(buf) // 2, len(buf) - 1):
        (tmp_path / "t.gcc").write_bytes(buf[:n])
        fails(capsys, 1, "info", tmp_path / "t.gcc")
        fails(capsys, 1, "decode", tmp_path / "t.gcc", "-o", tmp_path / "t.npz")
    # a damaged frame inside an intact container: the error names the tensor
    frames = unpack_frames(buf)
    name, first = frames[0]
    bad = bytearray(first)
    bad[20] ^= 0xFF
    (tmp_path / "d.gcc").write_bytes(pack_frames([(name, bytes(bad))] + [(n, bytes(f)) for n, f in frames[1:]]))
    assert repr(name) in fails(capsys, 1, "decode", tmp_path / "d.gcc", "-o", tmp_path / "d.npz")
    assert repr(name) in fails(capsys, 1, "info", tmp_path / "d.gcc")
    assert not (tmp_path / "d.npz").exists()
    # a frame whose header names an unregistered codec
    frame = codec.get_codec("none").encode(np.ones(2, np.float32))
    forged = frame.replace(b"none", b"nope")
    (tmp_path / "u.gcf").write_bytes(forged)
    fails(capsys, 1, "decode", tmp_path / "u.gcf", "-o", tmp_path / "u.npy")


def test_keyboard_interrupt_and_internal_error(capsys, monkeypatch):
    import codec.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli.commands, "cmd_list", interrupted)
    rc, out, err = run(capsys, "list")
    assert rc == 130 and out == "" and err == ""
    monkeypatch.setattr(cli.commands, "cmd_list", broken)
    assert "internal error" in fails(capsys, 3, "list")
    monkeypatch.setenv("GRADCODEC_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["list"])


def test_console_script_subprocess(tmp_path):
    """The installed entry point: exit status 1 and one line on stderr, no traceback."""
    exe = shutil.which("gradcodec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cmd = [exe] if exe else [sys.executable, "-m", "codec.cli"]
    p = subprocess.run(cmd + ["decode", str(tmp_path / "missing.gcf"), "-o", str(tmp_path / "o.npy")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.startswith("gradcodec: error: ") and p.stderr.count("\n") == 1
    assert "Traceback" not in p.stderr and "missing.gcf" in p.stderr


def test_demo_reports_a_failing_codec_and_goes_on(capsys, monkeypatch, small_sample):
    bad = dict(small_sample)
    bad["step0009/nan"] = np.array([1.0, np.nan], np.float32)
    monkeypatch.setattr(codec.sample, "load_sample", lambda: bad)
    rc, out, _ = run(capsys, "demo", "--json", "--repeat", "1", "--codecs", "fp16,none")
    assert rc == 1
    fp16, none = json.loads(out)["rows"]
    assert "step0009/nan" in fp16["error"] and "error" not in none
    rc, out, _ = run(capsys, "demo", "--repeat", "1", "--codecs", "fp16,none")
    assert rc == 1 and "failed" in out


def test_progress_bar_on_a_terminal(capsys, monkeypatch, tmp_path):
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    write_tensors(tmp_path / "in.npz", tensors())
    assert main(["encode", "fp16", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.gcc")]) == 0
    assert main(["roundtrip", "fp16", str(tmp_path / "in.npz"), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "container" in out and "TOTAL" in out
    assert "encoding with fp16" in err.getvalue()  # the (transient) bar went to stderr, not stdout


def test_progress_off_a_terminal_and_the_compile_notice(capsys, monkeypatch, tmp_path):
    """Piped, progress is a plain stderr line (here after every item: EVERY = 0); and a
    compilation longer than ``after`` says so once, from Numba's compile event."""
    from numba import njit

    from codec.cli import render

    monkeypatch.setattr(render.ProgressBar, "EVERY", 0.0)
    write_tensors(tmp_path / "in.npz", tensors())
    assert main(["roundtrip", "fp16", str(tmp_path / "in.npz"), "--repeat", "1"]) == 0
    err = capsys.readouterr().err
    assert "round trip with fp16: 1/6 done" in err and "Traceback" not in err
    said = []
    with render.compile_notice(said.append, after=0.0):
        njit(lambda v: v + 1)(1)  # (a fresh function: compiled here, not loaded from a cache)
        njit(lambda v: v + 2)(1)
    assert said == [render.compile_notice.NOTICE]


def test_roundtrip_steps(capsys, tmp_path):
    """--steps: a file of stepNNNN/ names is coded step by step; error feedback tracks the sum
    of the steps better than coding each alone; a file without steps is given N times."""
    rng = np.random.default_rng(3)
    steps = {f"step{s:04d}/{k}": rng.standard_normal(n).astype(np.float32) for s in (7, 12, 30) for k, n in (("w", 300), ("b", 20))}
    write_tensors(tmp_path / "steps.npz", steps)
    rc, out, _ = run(capsys, "roundtrip", "topk(ratio=0.1)", tmp_path / "steps.npz", "--steps", "3", "--json", "--repeat", "1")
    got = json.loads(out)["steps"]
    assert rc == 0 and got["count"] == 3 and 0 < got["error_ef"] < got["error"] < 1
    from codec.cli.commands import as_steps

    assert [sorted(s) for s in as_steps(steps, 2)] == [["b", "w"], ["b", "w"]] and as_steps(steps, 2)[1]["w"] is steps["step0012/w"]
    flat = {"w": steps["step0007/w"]}
    assert as_steps(flat, 3) == [flat] * 3
    rc, out, _ = run(capsys, "roundtrip", "fp16", tmp_path / "steps.npz", "--steps", "2", "--repeat", "1")
    assert rc == 0 and "over 2 steps" in out and "with error feedback" in out


def test_encode_many_writes_the_v2_frame_python_writes(capsys, tmp_path):
    """encode --many: one many-tensor frame, the bytes of Codec.encode_many, decoded back by
    name; --many and --container exclude each other."""
    t = {k: v for k, v in tensors().items()}
    write_tensors(tmp_path / "in.npz", t)
    rc, out, _ = run(capsys, "encode", "topk(ratio=0.5)+fp16", tmp_path / "in.npz", "-o", tmp_path / "m.gcf", "--many")
    assert rc == 0 and "many-tensor frame, 6 tensors" in out
    frame = (tmp_path / "m.gcf").read_bytes()
    assert frame == bytes(codec.get_codec("topk(ratio=0.5)+fp16").encode_many(read_tensors(tmp_path / "in.npz")))
    assert run(capsys, "decode", tmp_path / "m.gcf", "-o", tmp_path / "back.npz")[0] == 0
    back = read_tensors(tmp_path / "back.npz")
    assert list(back) == list(t) and all(back[k].shape == t[k].shape and back[k].dtype == t[k].dtype for k in t)
    fails(capsys, 2, "encode", "fp16", tmp_path / "in.npz", "-o", tmp_path / "x", "--many", "--container")
