"""Tensor files (codec.io): .npy, .npz, .safetensors; every float dtype, 0-d and empty tensors."""

from __future__ import annotations

import json
import struct
import zipfile

import numpy as np
import pytest

from codec.dtypes import bfloat16
from codec.io import SUPPORTED, TensorFileError, UnsupportedFormatError, read_tensors, write_tensors

DTYPES = [np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64)]
SHAPES = [(), (0,), (3, 0), (7,), (2, 3, 4)]


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def every_tensor():
    return {f"t{i}_{dt.name}_{'x'.join(map(str, s)) or 'scalar'}": make(s, dt, i)
            for i, (dt, s) in enumerate((dt, s) for dt in DTYPES for s in SHAPES)}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_npy_round_trip(tmp_path, dtype, shape):
    x = make(shape, dtype)
    p = tmp_path / "grad.npy"
    write_tensors(p, {"whatever": x})
    out = read_tensors(p)
    assert list(out) == ["grad"]  # named by the file stem
    assert_same(out["grad"], x)


@pytest.mark.parametrize("ext", [".npz", ".safetensors"])
def test_multi_round_trip_keeps_names_order_dtypes(tmp_path, ext):
    xs = every_tensor()
    xs["step0000/conv1.weight"] = make((8, 1, 3, 3), np.float32)
    xs["file"] = make((2,), np.float32)  # np.savez would choke on this keyword name
    p = tmp_path / f"grads{ext}"
    write_tensors(p, xs)
    out = read_tensors(p)
    assert list(out) == list(xs)
    for k in xs:
        assert_same(out[k], xs[k])
        assert out[k].flags.writeable


def test_bf16_npy_convention(tmp_path):
    """bfloat16 is stored as np.save stores it ('<V2') and read back as bfloat16."""
    x = make((5,), bfloat16)
    p = tmp_path / "b.npy"
    np.save(p, x)  # a file made by plain NumPy reads back too
    raw = np.load(p)
    assert raw.dtype == np.dtype("V2")  # what other programs see
    assert_same(read_tensors(p)["b"], x)
    write_tensors(tmp_path / "c.npy", {"c": x})
    assert (tmp_path / "c.npy").read_bytes() == p.read_bytes()
    assert_same(np.load(tmp_path / "c.npy").view(bfloat16), x)


def test_reads_reference_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    xs = {"a": make((2, 3), np.float32), "b": make((4,), np.float16), "c": make((3, 2), np.float64),
          "d": make((5,), bfloat16), "e": make((0, 2), np.float32)}
    p = tmp_path / "ref.safetensors"
    st.save_file(xs, str(p), metadata={"format": "np"})
    out = read_tensors(p)
    assert set(out) == set(xs)
    for k in xs:
        assert_same(out[k], xs[k])


def test_reference_reads_ours(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    xs = {"a": make((2, 3), np.float32), "b": make((4,), np.float16), "c": make((), np.float64)}
    p = tmp_path / "ours.safetensors"
    write_tensors(p, xs)
    out = st.load_file(str(p))
    for k in xs:
        assert_same(out[k], xs[k])


def test_npz_from_numpy_savez(tmp_path):
    p = tmp_path / "s.npz"
    np.savez(p, w=make((3, 3), np.float32), b=make((3,), np.float64))
    out = read_tensors(p)
    assert list(out) == ["w", "b"]


def test_big_endian_is_made_native(tmp_path):
    x = make((4,), np.float32).astype(">f4")
    p = tmp_path / "be.npy"
    np.save(p, x)
    y = read_tensors(p)["be"]
    assert y.dtype == np.float32 and y.dtype.isnative
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("bad", [np.arange(3), np.array([True]), np.ones(2, np.complex64), np.zeros(2, "V4"),
                                 np.zeros(2, [("a", "<f4")]), np.ones(2, np.longdouble)])
def test_npz_rejects_non_float_naming_the_key(tmp_path, bad):
    if bad.dtype == np.longdouble and np.dtype(np.longdouble).itemsize == 8:
        pytest.skip("long double is float64 here")
    p = tmp_path / "m.npz"
    np.savez(p, good=np.ones(2, np.float32), counts=bad)
    with pytest.raises(TensorFileError, match="'counts'"):
        read_tensors(p)


def test_npy_rejects_ints_and_pickles(tmp_path):
    np.save(tmp_path / "i.npy", np.arange(3))
    with pytest.raises(TensorFileError, match="int64"):
        read_tensors(tmp_path / "i.npy")
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(TensorFileError, match="o.npy"):
        read_tensors(tmp_path / "o.npy")


def test_unknown_extension_and_missing_file(tmp_path):
    with pytest.raises(UnsupportedFormatError) as e:
        read_tensors(tmp_path / "x.pt")
    for ext in SUPPORTED:
        assert ext in str(e.value)
    with pytest.raises(UnsupportedFormatError):
        write_tensors(tmp_path / "x.h5", {"a": np.ones(1, np.float32)})
    with pytest.raises(FileNotFoundError):
        read_tensors(tmp_path / "missing.npz")
    with pytest.raises(IsADirectoryError):
        (tmp_path / "dir.npy").mkdir()
        read_tensors(tmp_path / "dir.npy")


@pytest.mark.parametrize("ext", SUPPORTED)
def test_garbage_files(tmp_path, ext):
    for content in (b"", b"hello world, not a tensor file", b"\x93NUMPY\x01\x00", b"PK\x03\x04garbage"):
        p = tmp_path / f"g{ext}"
        p.write_bytes(content)
        with pytest.raises(TensorFileError):
            read_tensors(p)


def test_wrong_container_kinds(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(2, np.float32))
    (tmp_path / "a.npz").write_bytes((tmp_path / "a.npy").read_bytes())
    with pytest.raises(TensorFileError, match="npy"):
        read_tensors(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", a=np.ones(2, np.float32))
    (tmp_path / "b.npy").write_bytes((tmp_path / "b.npz").read_bytes())
    with pytest.raises(TensorFileError):
        read_tensors(tmp_path / "b.npy")
    with zipfile.ZipFile(tmp_path / "c.npz", "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(TensorFileError, match="notes.txt"):
        read_tensors(tmp_path / "c.npz")


def _st(tmp_path, header, data=b"", pad=True):
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return p


@pytest.mark.parametrize(
    "header, data, match",
    [
        ({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8), "I64"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4), "needs 8"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, bytes(4), "data_offsets"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), "shape"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4), "data_offsets"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, bytes(8), "overlaps"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), "gap"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8), "data area"),
        ({"a": [1, 2]}, b"", "JSON object"),
        ([1, 2], b"", "JSON object"),
        ({"a": {"shape": [1], "data_offsets": [0, 4]}}, bytes(4), "dtype"),
    ],
)
def test_safetensors_validation(tmp_path, header, data, match):
    with pytest.raises(TensorFileError, match=match):
        read_tensors(_st(tmp_path, header, data))


def test_safetensors_header_length_checks(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(TensorFileError, match="header length"):
        read_tensors(p)
    p.write_bytes(struct.pack("<Q", 2) + b"{]")
    with pytest.raises(TensorFileError, match="JSON"):
        read_tensors(p)


def test_safetensors_unaligned_and_metadata(tmp_path):
    x = np.arange(3, dtype=np.float32)
    header = {"__metadata__": {"k": "v"}, "a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
              "b": {"dtype": "F32", "shape": [3], "data_offsets": [2, 14]}}
    out = read_tensors(_st(tmp_path, header, np.float16(1.5).tobytes() + x.tobytes(), pad=False))
    assert list(out) == ["a", "b"]
    np.testing.assert_array_equal(out["b"], x)
    assert out["a"].item() == 1.5


def test_write_rules(tmp_path):
    two = {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)}
    with pytest.raises(ValueError, match="exactly one"):
        write_tensors(tmp_path / "two.npy", two)
    assert not list(tmp_path.iterdir())  # nothing left behind
    with pytest.raises(TensorFileError, match="'i'"):
        write_tensors(tmp_path / "i.npz", {"i": np.arange(2)})
    with pytest.raises(ValueError, match="twice"):
        write_tensors(tmp_path / "d.npz", [("a", np.ones(1)), ("a", np.ones(1))])
    with pytest.raises(ValueError, match="reserved"):
        write_tensors(tmp_path / "m.safetensors", {"__metadata__": np.ones(1)})
    write_tensors(tmp_path / "l.npz", [("x", np.ones((2, 2), np.float32)[:, 0])])  # non-contiguous input
    assert read_tensors(tmp_path / "l.npz")["x"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.npz"]  # no temporary files remain


# ------------------------------------------------------------------ names and hostile files (issue 13)
@pytest.mark.parametrize("names", [["a\x00x", "a\x00y"], ["w", "w\x00"], ["../up"], ["/abs"], ["a//b"], ["./x"],
                                   ["a\\b"], ["a" * 65532], ["a", "a.npy"], ["\ud800"]],
                         ids=["nul-collision", "nul-suffix", "parent", "absolute", "empty", "dot", "backslash",
                              "too-long", "np.load-ambiguity", "surrogate"])
def test_npz_refuses_names_it_cannot_hold(tmp_path, names):
    """Each of these was written as a truncated, colliding or path-like zip member (or raised
    a struct.error / UnicodeEncodeError from zipfile); now a TensorNameError naming it."""
    xs = {n: np.full(2, i, np.float32) for i, n in enumerate(names)}
    with pytest.raises(ValueError, match="tensors? '"):
        write_tensors(tmp_path / "x.npz", xs)
    assert not list(tmp_path.iterdir())
    from codec.io import TensorNameError, check_names

    with pytest.raises(TensorNameError):
        check_names("x.npz", names)
    if "\ud800" not in names:  # .safetensors keeps them all
        write_tensors(tmp_path / "x.safetensors", xs)
        back = read_tensors(tmp_path / "x.safetensors")
        assert list(back) == names and all(back[n].tolist() == xs[n].tolist() for n in names)
    else:
        with pytest.raises(TensorNameError, match="Unicode"):
            write_tensors(tmp_path / "x.safetensors", xs)


def test_npz_keeps_relative_paths_and_odd_names(tmp_path):
    names = ["step0000/conv1.weight", "", "a/", "...", "x.npy", "é/ü", "c" * 65531]
    xs = {n: np.full(2, i, np.float32) for i, n in enumerate(names)}
    write_tensors(tmp_path / "x.npz", xs)
    assert list(read_tensors(tmp_path / "x.npz")) == names
    with np.load(tmp_path / "x.npz") as z:
        assert z.files == names and all(z[n].tolist() == xs[n].tolist() for n in names)
    with pytest.raises(ValueError, match="NUL"):  # and one that it cannot hold
        write_tensors(tmp_path / "y.npz", {"ok": np.ones(1), "a\x00": np.ones(1)})


def test_safetensors_header_too_big_to_read_back_is_refused(tmp_path, monkeypatch):
    """A header longer than readers accept (100 MB; 200 bytes here) was written anyway."""
    import codec.io.safetensors

    monkeypatch.setattr(codec.io.safetensors, "MAX_HEADER", 200)
    xs = {f"tensor-{i:03d}": np.ones(1, np.float32) for i in range(10)}
    with pytest.raises(ValueError, match="header"):
        write_tensors(tmp_path / "x.safetensors", xs)
    assert not list(tmp_path.iterdir())


def _npy(shape, descr="<f8", data=b"", fortran=False):
    head = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode("latin1")
    head += b" " * (63 - (len(head) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + data


def test_npz_members_are_read_by_name_not_by_npzfile_lookup(tmp_path):
    with zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
        z.writestr("a.npy", _npy((1,), data=struct.pack("<d", 1.0)))
        z.writestr("a.npy.npy", _npy((2,), data=struct.pack("<2d", 2.0, 3.0)))
    out = read_tensors(tmp_path / "a.npz")
    assert {k: v.tolist() for k, v in out.items()} == {"a": [1.0], "a.npy": [2.0, 3.0]}
    with zipfile.ZipFile(tmp_path / "d.npz", "w") as z:  # two members, one key: refused, not one dropped
        z.writestr("a.npy", _npy((1,), data=bytes(8)))
        z.writestr("a", _npy((2,), data=bytes(16)))
    with pytest.raises(TensorFileError, match="'a'"):
        read_tensors(tmp_path / "d.npz")


@pytest.mark.parametrize("ext, shape, data", [
    (".npy", (10**11,), bytes(16)), (".npy", (2**40, 2**20), b""), (".npy", (3,), bytes(16)), (".npy", (3,), bytes(32)),
    (".npy", (-1,), bytes(8)), (".npz", (10**11,), bytes(16)), (".npz", (3,), bytes(32)),
], ids=["npy-745GiB", "npy-4EiB", "npy-short", "npy-long", "npy-negative", "npz-745GiB", "npz-long"])
def test_npy_header_must_match_the_bytes_there(tmp_path, shape, data, ext):
    """The header's shape and dtype must account for exactly the bytes after it, checked
    before allocating (NumPy allocated 745 GiB for a 100-byte file: MemoryError, exit 3)."""
    raw = _npy(shape, data=data)
    p = tmp_path / f"h{ext}"
    if ext == ".npy":
        p.write_bytes(raw)
    else:
        with zipfile.ZipFile(p, "w") as z:
            z.writestr("h.npy", raw)
    with pytest.raises(TensorFileError, match="'h'"):
        read_tensors(p)


def test_fortran_order_comes_back_c_contiguous(tmp_path):
    x = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.save(tmp_path / "f.npy", x)
    np.savez(tmp_path / "f.npz", f=x)
    for p in (tmp_path / "f.npy", tmp_path / "f.npz"):
        (y,) = read_tensors(p).values()
        assert y.flags.c_contiguous and y.flags.writeable
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("text, match", [
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', "twice"),
    (b"[" * 100000, "JSON"),
    (b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}', "JSON"),
], ids=["duplicate-key", "deep", "long-integer"])
def test_safetensors_hostile_headers(tmp_path, text, match):
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + bytes(8))
    with pytest.raises(TensorFileError, match=match):
        read_tensors(p)


def test_write_never_touches_an_existing_temporary_name(tmp_path, monkeypatch):
    """The temporary file is created exclusively: a file already at a name the writer might
    pick (here: the old fixed '.x.npz.PID.tmp', or a symlink there) is never written through."""
    import os

    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.symlink(victim, tmp_path / f".x.npz.{os.getpid()}.tmp")
    write_tensors(tmp_path / "x.npz", {"a": np.ones(2, np.float32)})
    assert victim.read_bytes() == b"keep me"
    assert list(read_tensors(tmp_path / "x.npz")) == ["a"]


def test_npz_folder_entries_are_not_tensors(tmp_path):
    """'zip -r' writes an entry per folder; it holds no tensor (it was 'not an array')."""
    with zipfile.ZipFile(tmp_path / "r.npz", "w") as z:
        z.writestr("step0000/", b"")
        z.writestr("step0000/w.npy", _npy((2,), data=struct.pack("<2d", 1.0, 2.0)))
    out = read_tensors(tmp_path / "r.npz")
    assert {k: v.tolist() for k, v in out.items()} == {"step0000/w": [1.0, 2.0]}
