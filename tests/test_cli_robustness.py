"""The command line against hostile inputs (issue 13, "Trust", CLI): it never overwrites its
input, never renames or drops a tensor, and every failure is exit 1 or 2 with one line."""

from __future__ import annotations

import json
import os
import random
import struct
import sys
import zipfile

import numpy as np
import pytest

import codec
from codec.cli import main
from codec.container import pack_frames, unpack_frames
from codec.io import read_tensors, write_tensors


def run(capsys, *argv):
    rc = main([os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def fails(capsys, code, *argv) -> str:
    rc, out, err = run(capsys, *argv)
    assert rc == code, (rc, out, err[:500])
    assert err.startswith("gradcodec: error: ") and err.count("\n") == 1, err[:500]
    assert "internal error" not in err and "Traceback" not in err
    return err


def frame(n=3, value=1.0):
    return codec.get_codec("none").encode(np.full(n, value, np.float32))


def listing(path):
    return sorted(p.name for p in path.iterdir())


# ------------------------------------------------------------------ never overwrite the input
def _links(tmp_path, src, how):
    """A path naming the same file as ``src``: itself, a symlink, a hard link, a '..' detour."""
    if how == "same":
        return src
    if how == "symlink":
        os.symlink(src, tmp_path / ("link" + src.suffix))
        return tmp_path / ("link" + src.suffix)
    if how == "hardlink":
        os.link(src, tmp_path / ("hard" + src.suffix))
        return tmp_path / ("hard" + src.suffix)
    (tmp_path / "sub").mkdir()
    return tmp_path / "sub" / ".." / src.name


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotdot"])
@pytest.mark.parametrize("ext", [".npy", ".npz", ".safetensors"])
def test_encode_refuses_to_overwrite_its_input(capsys, tmp_path, how, ext):
    src = tmp_path / f"g{ext}"
    write_tensors(src, {"g": np.arange(5, dtype=np.float32)})
    before = src.read_bytes()
    out = _links(tmp_path, src, how)
    err = fails(capsys, 2, "encode", "fp16", src, "-o", out)
    assert "input" in err and "overwrite" in err
    fails(capsys, 2, "encode", "fp16", src, "-o", out, "--container")
    assert src.read_bytes() == before


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotdot"])
def test_decode_refuses_to_overwrite_its_input(capsys, tmp_path, how):
    # a frame file that happens to carry a tensor-file extension: decode would replace it
    src = tmp_path / "g.npz"
    src.write_bytes(pack_frames([("a", frame()), ("b", frame())]))
    before = src.read_bytes()
    out = _links(tmp_path, src, how)
    assert "overwrite" in fails(capsys, 2, "decode", src, "-o", out)
    assert src.read_bytes() == before


# ------------------------------------------------------------------ names a .npz cannot hold
BAD_NPZ = {
    "65,532 bytes": ["a" * 65532],
    "65,535 bytes": ["b" * 65535],
    "multibyte, too long": ["é" * 32766],
    "NUL collision": ["a\x00x", "a\x00y"],
    "NUL suffix": ["w", "w\x00"],
    "parent": ["../up"],
    "inner parent": ["x/../../up"],
    "absolute": ["/etc/abs"],
    "empty component": ["a//b"],
    "dot component": ["./x"],
    "backslash": ["..\\win"],
    "np.load ambiguity": ["a", "a.npy"],
}


@pytest.mark.parametrize("names", BAD_NPZ.values(), ids=BAD_NPZ.keys())
def test_decode_refuses_names_npz_cannot_hold(capsys, tmp_path, names):
    c = tmp_path / "c.gcc"
    c.write_bytes(pack_frames([(n, frame(3, i)) for i, n in enumerate(names)]))
    (tmp_path / "x.npz").write_bytes(b"precious")  # an existing OUT stays as it was
    err = fails(capsys, 1, "decode", c, "-o", tmp_path / "x.npz")
    assert "tensor" in err and ".npz" in err
    assert any(repr(n)[:60] in err for n in names), err[:300]
    assert (tmp_path / "x.npz").read_bytes() == b"precious"
    assert listing(tmp_path) == ["c.gcc", "x.npz"]
    # .safetensors keeps every one of them, exactly
    rc, out, _ = run(capsys, "decode", c, "-o", tmp_path / "x.safetensors")
    assert rc == 0 and f"({len(names)} tensor" in out
    back = read_tensors(tmp_path / "x.safetensors")
    assert list(back) == names
    for i, n in enumerate(names):
        assert back[n].tolist() == [float(i)] * 3


def test_names_npz_keeps_round_trip_exactly(capsys, tmp_path):
    names = ["step0000/conv1.weight", "", "a/", "...", "x.npy", "é/ü", "c" * 65531, "[/bold]", "a b"]
    c = tmp_path / "c.gcc"
    c.write_bytes(pack_frames([(n, frame(2, i)) for i, n in enumerate(names)]))
    rc, _, _ = run(capsys, "decode", c, "-o", tmp_path / "x.npz")
    assert rc == 0
    assert list(read_tensors(tmp_path / "x.npz")) == names
    with np.load(tmp_path / "x.npz") as z:
        assert z.files == names
        for i, n in enumerate(names):
            assert z[n].tolist() == [float(i)] * 2
    # and the name that zip cannot hold is still refused, not truncated
    c.write_bytes(pack_frames([("ok", frame()), ("a\x00b", frame())]))
    fails(capsys, 1, "decode", c, "-o", tmp_path / "y.npz")


def test_single_frame_named_by_a_stem_npz_cannot_hold(capsys, tmp_path):
    (tmp_path / "a\\b.gcf").write_bytes(frame())
    assert "backslash" in fails(capsys, 1, "decode", tmp_path / "a\\b.gcf", "-o", tmp_path / "o.npz")
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file names must be UTF-8")
def test_names_that_are_not_unicode(capsys, tmp_path):
    """A lone surrogate (a JSON escape in safetensors, or a non-UTF-8 file name) can go
    nowhere that stores names: exit 1 naming it; where no name is stored it works."""
    header = {"\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
    text = json.dumps(header).encode()
    st = tmp_path / "s.safetensors"
    st.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    assert "\\ud800" in fails(capsys, 1, "encode", "fp16", st, "-o", tmp_path / "s.gcc")
    assert not (tmp_path / "s.gcc").exists()
    rc, out, _ = run(capsys, "roundtrip", "fp16", st, "--repeat", "1")
    assert rc == 0 and "\\ud800" in out
    rc, out, _ = run(capsys, "roundtrip", "fp16", st, "--repeat", "1", "--json")
    assert rc == 0 and "\\ud800" in out
    # a .npy whose file name is not UTF-8: fine as a bare frame, refused where a name is kept
    bad = os.path.join(os.fsencode(tmp_path), b"g\xff.npy")
    write_tensors(os.fsdecode(bad), {"g": np.ones(2, np.float32)})
    rc, out, _ = run(capsys, "encode", "fp16", bad, "-o", tmp_path / "g.gcf")
    assert rc == 0
    fails(capsys, 1, "encode", "fp16", bad, "-o", tmp_path / "g.gcc", "--container")
    gcf = os.path.join(os.fsencode(tmp_path), b"h\xfe.gcf")
    with open(gcf, "wb") as f:
        f.write(frame())
    fails(capsys, 1, "decode", gcf, "-o", tmp_path / "h.npz")
    fails(capsys, 1, "decode", gcf, "-o", tmp_path / "h.safetensors")
    assert run(capsys, "decode", gcf, "-o", tmp_path / "h.npy")[0] == 0


def test_container_name_too_long_is_exit_1(capsys, tmp_path):
    st = tmp_path / "long.safetensors"
    write_tensors(st, {"n" * 70000: np.ones(2, np.float32), "b": np.ones(1, np.float32)})
    assert "65,535" in fails(capsys, 1, "encode", "fp16", st, "-o", tmp_path / "o.gcc")
    assert not (tmp_path / "o.gcc").exists()


@pytest.mark.parametrize("name", ["[/bold]", "[red]x[/red]", "tab\there\x1b[31m"])
def test_names_are_shown_as_they_are(capsys, tmp_path, name):
    """Names are data, not rich markup ('[/bold]' once crashed info with exit 3)."""
    c = tmp_path / "c.gcc"
    c.write_bytes(pack_frames([(name, frame()), ("b", frame())]))
    rc, out, _ = run(capsys, "info", c)
    shown = name if name.isprintable() else repr(name)
    assert rc == 0 and shown in out and "\x1b" not in out
    write_tensors(tmp_path / "m.safetensors", {name: np.ones(2, np.float32)})
    rc, out, _ = run(capsys, "roundtrip", "none", tmp_path / "m.safetensors", "--repeat", "1")
    assert rc == 0 and shown in out and "\x1b" not in out


# ------------------------------------------------------------------ hostile tensor files
def _npy(shape, descr="<f8", data=b"", version=(1, 0)):
    head = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    head += b" " * (63 - (len(head) + 10) % 64) + b"\n"
    n = struct.pack("<H", len(head)) if version == (1, 0) else struct.pack("<I", len(head))
    return b"\x93NUMPY" + bytes(version) + n + head + data


def _zip(path, members, method=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=method) as z:
        for name, data in members:
            z.writestr(zipfile.ZipInfo(name), data, compress_type=method)


def _hostile(tmp_path):
    """name -> path of a file that must be refused with exit 1 (each one exit 3 once)."""
    out = {}
    big = _npy((10**11,), data=bytes(16))
    (tmp_path / "big.npy").write_bytes(big)
    out["npy claims 745 GiB"] = tmp_path / "big.npy"
    _zip(tmp_path / "big.npz", [("a.npy", big)])
    out["npz member claims 745 GiB"] = tmp_path / "big.npz"
    _zip(tmp_path / "enc.npz", [("a.npy", _npy((2,), data=bytes(16)))], zipfile.ZIP_DEFLATED)
    b = bytearray((tmp_path / "enc.npz").read_bytes())
    b[6] |= 1
    b[b.find(b"PK\x01\x02") + 8] |= 1
    (tmp_path / "enc.npz").write_bytes(bytes(b))
    out["encrypted member"] = tmp_path / "enc.npz"
    _zip(tmp_path / "meth.npz", [("a.npy", _npy((2,), data=bytes(16)))])
    b = bytearray((tmp_path / "meth.npz").read_bytes())
    b[8] = 99
    b[b.find(b"PK\x01\x02") + 10] = 99
    (tmp_path / "meth.npz").write_bytes(bytes(b))
    out["unknown compression"] = tmp_path / "meth.npz"
    _zip(tmp_path / "dup.npz", [("a.npy", _npy((1,), data=bytes(8))), ("a", _npy((2,), data=bytes(16)))])
    out["two members, one key"] = tmp_path / "dup.npz"
    (tmp_path / "neg.npy").write_bytes(_npy((-1,), data=bytes(8)))
    out["negative shape"] = tmp_path / "neg.npy"
    for label, text in (("deep JSON", b"[" * 100000), ("huge integer", b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}'),
                        ("duplicate key", b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')):
        p = tmp_path / f"{label.replace(' ', '_')}.safetensors"
        p.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
        out[label] = p
    return out


def test_hostile_tensor_files_are_exit_1(capsys, tmp_path):
    for label, path in _hostile(tmp_path).items():
        for cmd in (["encode", "fp16", path, "-o", tmp_path / "o.gcf"], ["roundtrip", "fp16", path, "--repeat", "1"]):
            rc, out, err = run(capsys, *cmd)
            assert rc == 1, (label, rc, err)
            assert err.startswith("gradcodec: error: ") and err.count("\n") == 1 and "internal" not in err, (label, err)
    assert not (tmp_path / "o.gcf").exists()


def test_npz_member_a_npy_is_not_confused_with_key_a_npy(capsys, tmp_path):
    """np.load's NpzFile gives member 'a.npy' for key 'a.npy' even when that key is the member
    'a.npy.npy': the tensor 'a.npy' silently became a copy of 'a'."""
    _zip(tmp_path / "amb.npz", [("a.npy", _npy((1,), data=struct.pack("<d", 1.0))),
                                ("a.npy.npy", _npy((2,), data=struct.pack("<2d", 2.0, 3.0)))])
    rc, _, _ = run(capsys, "encode", "none", tmp_path / "amb.npz", "-o", tmp_path / "amb.gcc")
    assert rc == 0
    got = {n: codec.decode(f).tolist() for n, f in unpack_frames((tmp_path / "amb.gcc").read_bytes())}
    assert got == {"a": [1.0], "a.npy": [2.0, 3.0]}


def _mutants(raw: bytes, rng: random.Random, n: int):
    for _ in range(n):
        b = bytearray(raw)
        kind = rng.randrange(4)
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            del b[rng.randrange(len(b)):]
        elif kind == 2:
            i = rng.randrange(len(b))
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:  # a length-looking field made huge
            i = rng.randrange(max(1, len(b) - 8))
            b[i:i + 8] = struct.pack("<Q", rng.choice([2**31, 2**40, 2**63 - 1, 10**11]))
        yield bytes(b)


@pytest.mark.parametrize("ext", [".npy", ".npz", ".safetensors"])
def test_fuzzed_tensor_files_never_internal_error(capsys, tmp_path, ext):
    src = tmp_path / f"src{ext}"
    write_tensors(src, {"w": np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)} if ext == ".npy"
                  else {"w": np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6), "b": np.ones(3, np.float16)})
    raw = src.read_bytes()
    rng = random.Random(1234)
    path = tmp_path / f"m{ext}"
    seen = set()
    # the crafted shapes first: a header that claims far more data than the file holds
    crafted = [_npy((10**11,), data=bytes(8)), _npy((2**40, 2**20), "<f4")]
    if ext == ".npz":
        crafted = [_zip_bytes(tmp_path, c) for c in crafted]
    elif ext == ".safetensors":  # JSON nested too deep, a number too long to parse
        crafted = [struct.pack("<Q", len(t)) + t for t in (b"[" * 100000, b'{"w":{"shape":[' + b"7" * 5000 + b"]}}")]
    for data in [*crafted, *_mutants(raw, rng, 300)]:
        path.write_bytes(data)
        rc, _, err = run(capsys, "encode", "none", path, "-o", tmp_path / "o.gcc", "--container")
        assert rc in (0, 1), (rc, err[:300], data[:120])
        assert rc == 0 or (err.startswith("gradcodec: error: ") and err.count("\n") == 1)
        seen.add(rc)
    assert 1 in seen


def _zip_bytes(tmp_path, member: bytes) -> bytes:
    _zip(tmp_path / "z.tmp", [("w.npy", member)])
    return (tmp_path / "z.tmp").read_bytes()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_output_that_is_a_pipe_is_written_not_replaced(capsys, tmp_path):
    """OUT may be a pipe (or /dev/null, /dev/stdout): it is written into; renaming a temporary
    file over it replaced the pipe itself (as root, over /dev/null: the device node)."""
    import stat

    src = tmp_path / "g.npy"
    write_tensors(src, {"g": np.arange(4, dtype=np.float32)})
    fifo = tmp_path / "out.gcf"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there, so the writer's open does not block
    try:
        rc, _, err = run(capsys, "encode", "none", src, "-o", fifo)
        assert rc == 0, err
        got = os.read(rfd, 1 << 16)
    finally:
        os.close(rfd)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert codec.decode(got).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert listing(tmp_path) == ["g.npy", "out.gcf"]


# ------------------------------------------------------------------ every frame kind (issue 28)
def _frame_kinds():
    """One file of each kind the command line reads, with the tensors it holds (None: it cannot
    be decoded without the sender's layout)."""
    rng = np.random.default_rng(28)
    a, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    c = codec.get_codec("topk(ratio=0.5)+fp16")
    named = {"w": a, "b": b}
    return {
        "v1": (c.encode(a), {"FILE": a}),
        "container": (pack_frames([("w", c.encode(a)), ("b", c.encode(b))]), named),
        "v2-table": (c.encode_many(named), named),
        "v2-unnamed": (c.encode_many([a, b]), {"0": a, "1": b}),
        "v2-zstd": (codec.get_codec("fp16+zstd").encode_many(named), named),
        "v2-joint": (codec.get_codec("qsgd(levels=64)").encode_many(named, joint=True), named),
        "v2-hash": (c.encode_many(named, layout="hash"), None),
    }


@pytest.mark.parametrize("kind", list(_frame_kinds()))
def test_every_frame_kind_through_info_and_decode(tmp_path, capsys, kind):
    """``gradcodec info`` on a frame written by encode_many crashed (exit 3, KeyError
    'elements'): info, info --json and decode read every kind through one function
    (codec.cli.frames) and never exit 3."""
    data, tensors = _frame_kinds()[kind]
    f = tmp_path / "FILE.gcf"
    f.write_bytes(data)
    if tensors is None:  # the layout-hash form: only the sender's layout reads it
        for argv in (("info", f), ("info", f, "--json"), ("decode", f, "-o", tmp_path / "o.npz")):
            err = fails(capsys, 1, *argv)
            assert "layout-hash form (2 tensors, layout hash " in err and "codec.Layout" in err
        assert listing(tmp_path) == ["FILE.gcf"]
        return
    rc, out, err = run(capsys, "info", f)
    assert rc == 0, err
    for name in tensors:
        assert (name if kind != "v2-unnamed" else "float32") in out
    rc, out, err = run(capsys, "info", f, "--json")
    assert rc == 0, err
    d = json.loads(out)
    many = kind.startswith("v2")
    rows = d["tensors"] if kind != "v1" else [d]
    assert [r["elements"] for r in rows] == [x.size for x in tensors.values()]
    assert [r["raw_bytes"] for r in rows] == [x.nbytes for x in tensors.values()]
    if many:
        assert d["format_version"] == 2 and d["frame_bytes"] == len(data)
        assert d["joint"] == (kind == "v2-joint") and d["layout"] == "table"
        assert [t["name"] for t in d["tensors"]] == ([None, None] if kind == "v2-unnamed" else list(tensors))
    rc, out, err = run(capsys, "decode", f, "-o", tmp_path / "o.npz")
    assert rc == 0, err
    back = read_tensors(tmp_path / "o.npz")
    assert list(back) == list(tensors)
    want = codec.decode_many(data) if many else ({n: codec.decode(fr) for n, fr in unpack_frames(data)} if kind == "container" else {"FILE": codec.decode(data)})
    for got, ref in zip(back.values(), want.values() if isinstance(want, dict) else want):
        np.testing.assert_array_equal(got, ref)
    if len(tensors) > 1:  # several tensors never go into one .npy
        err = fails(capsys, 2, "decode", f, "-o", tmp_path / "o.npy")
        assert "a .npy file holds exactly one" in err


def test_a_many_tensor_frame_inside_a_container_is_exit_1(tmp_path, capsys):
    """A container holds byte strings (pack_frames takes a v2 frame too): the CLI says so."""
    data, _ = _frame_kinds()["v2-table"]
    f = tmp_path / "c.gcf"
    f.write_bytes(pack_frames([("x", frame()), ("m", data)]))
    for argv in (("info", f), ("info", f, "--json"), ("decode", f, "-o", tmp_path / "o.npz")):
        assert "tensor 'm': a many-tensor frame (format v2) inside a container" in fails(capsys, 1, *argv)


def test_a_damaged_many_tensor_frame_is_exit_1(tmp_path, capsys):
    data, _ = _frame_kinds()["v2-table"]
    for cut in (9, len(data) // 2, len(data) - 1):
        f = tmp_path / f"cut{cut}.gcf"
        f.write_bytes(data[:cut])
        for argv in (("info", f), ("decode", f, "-o", tmp_path / "o.npz")):
            assert "gradcodec: error: " + str(f) in fails(capsys, 1, *argv)
    flipped = bytearray(data)
    flipped[-3] ^= 0x10
    (tmp_path / "flip.gcf").write_bytes(bytes(flipped))
    assert "checksum" in fails(capsys, 1, "decode", tmp_path / "flip.gcf", "-o", tmp_path / "o.npz")
