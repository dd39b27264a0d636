"""The ``gradcodec`` command line (docs/cli.md).

    gradcodec list [--json]                        registered codecs and their parameters
    gradcodec encode SPEC INPUT -o OUT             tensors -> a frame (one) or a container (several)
    gradcodec decode FRAMEFILE -o OUT              frame or container -> .npy / .npz / .safetensors
    gradcodec info FRAMEFILE [--json]              the header(s), nothing decoded
    gradcodec roundtrip SPEC INPUT [--json]        ratio, error and speed per tensor
    gradcodec demo [--json] [--codecs SPEC,...]    every codec on the bundled gradient sample

Exit status: 0 success; 1 bad data (missing, unreadable or corrupt file, a tensor name the
output cannot hold, data a codec refuses, not enough memory); 2 usage (bad arguments, bad
spec, unknown codec, unsupported file extension, an output that is the input file); 3 an
internal error (a bug, never caused by a file's content or a name: one line, or a traceback
with GRADCODEC_DEBUG=1); 130 interrupted.  Every error is one line ``gradcodec: error: ...``
on stderr.

Outputs: a command never writes over its input (same file by any path, symlink or hard
link); OUT is written to a fresh temporary file and renamed into place; a tensor is never
renamed or dropped: a name the output format cannot hold (``codec.io.check_names``, a
container's UTF-8 and length limits) is refused before any work.

``gradcodec --help`` imports only the ``codec`` package itself (which loads NumPy but no
Numba kernel); rich, the codec stages' kernels and the file readers are imported by the
commands that need them.
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

PROG = "gradcodec"


class UsageError(Exception):
    """Bad arguments, spec or codec name: exit status 2."""


class DataError(Exception):
    """A missing, unreadable or corrupt file, or data a codec refuses: exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise UsageError(f"{message} (see '{self.prog} --help')")


class _Version(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import codec

        print(f"{PROG} {codec.__version__}")
        parser.exit(0)


# ============================================================================ helpers
def _codec(spec: str):
    """The codec for a user-given spec; any failure is a usage error."""
    import codec

    try:
        return codec.get_codec(spec)
    except (ValueError, TypeError, codec.CodecError) as e:
        raise UsageError(str(e)) from None


def _read_tensors(path: str) -> dict:
    from codec import io

    try:
        return io.read_tensors(path)
    except io.UnsupportedFormatError as e:
        raise UsageError(str(e)) from None
    except io.TensorFileError as e:
        raise DataError(str(e)) from None


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _refuse_overwrite(output: str, *inputs: str) -> None:
    """UsageError when ``output`` is (or, through a symlink or hard link, is the same file as)
    one of ``inputs``: a command never replaces its own input."""
    for path in inputs:
        try:
            same = os.path.samefile(output, path)  # same device and inode: any path, symlink or hard link
        except (OSError, ValueError):  # one of them does not exist (yet): not the same file
            same = False
        if same:
            raise UsageError(f"output {output!r} is the input file {path!r}; refusing to overwrite it, choose another -o")


def _write_bytes(path: str, data) -> None:
    """Write under a fresh temporary name, then rename: no partial OUT on failure."""
    from codec.io import atomic_write

    try:
        atomic_write(path, lambda f: f.write(data))
    except OSError as e:
        raise DataError(f"cannot write {path}: {e.strerror or e}") from None


def _write_tensors(path: str, tensors) -> None:
    from codec import io

    try:
        io.write_tensors(path, tensors)
    except OSError as e:
        raise DataError(f"cannot write {path}: {e.strerror or e}") from None
    except io.UnsupportedFormatError as e:
        raise UsageError(str(e)) from None
    except (ValueError, TypeError) as e:  # a name the format cannot hold, a non-float array
        raise DataError(f"cannot write {path}: {e}") from None


def _check_names(path: str, names) -> None:
    """Refuse, before any decoding, a tensor name that OUT's format cannot store unchanged."""
    from codec import io

    try:
        io.check_names(path, names)
    except io.UnsupportedFormatError as e:
        raise UsageError(str(e)) from None
    except (ValueError, TypeError) as e:
        raise DataError(f"cannot write {path}: {e}") from None


def _check_container_names(path: str, names) -> None:
    """Refuse, before any encoding, a name a container cannot hold (docs/format.md)."""
    from codec.container import MAX_NAME

    for name in names:
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise DataError(f"cannot write {path}: tensor {name!r:.200}: the name is not valid Unicode text (it holds a lone surrogate)") from None
        if size > MAX_NAME:
            raise DataError(f"cannot write {path}: tensor {name[:40]!r}...: the name is {size:,} UTF-8 bytes; a container name holds at most {MAX_NAME:,}")


def _label(name: str):
    """A tensor name for a table cell: as it is when printable, else its repr (so control
    characters, escapes and lone surrogates show as escapes); never parsed as rich markup."""
    from rich.text import Text

    return Text(name if name.isprintable() else repr(name))


def _check_out_ext(path: str) -> str:
    from codec import io

    ext = os.path.splitext(path)[1].lower()
    if ext not in io.SUPPORTED:
        raise UsageError(f"output {path!r}: unsupported extension {ext or '(none)'!r}; supported: {', '.join(io.SUPPORTED)}")
    return ext


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False, markup=False)


def _show(*renderables) -> None:
    """Print rich renderables to stdout, never parsing text as rich markup (tensor names and
    paths come from files: '[/x]' is a name, not a closing tag).  Off a terminal (pipes, files, tests) render plain text
    200 columns wide (rich would wrap at 80) with trailing blanks stripped."""
    import io

    from rich.console import Console

    from rich.text import Text

    def emit(con):
        for i, r in enumerate(renderables):
            title, caption = getattr(r, "gc_title", None), getattr(r, "gc_caption", None)
            if title:
                con.print(Text(title, style="bold"), soft_wrap=True)
            con.print(r)
            if caption:
                con.print(Text(caption, style="dim"), soft_wrap=True)
            if i + 1 < len(renderables):
                con.print()

    if hasattr(sys.stdout, "isatty") and sys.stdout.isatty():
        from rich.measure import Measurement

        con = Console(file=sys.stdout, highlight=False, markup=False)
        # never squeeze numbers into ellipses: a table wider than the terminal is drawn at its
        # natural width and the terminal wraps it
        need = max((Measurement.get(con, con.options.update_width(10_000), r).maximum for r in renderables if hasattr(r, "gc_title")), default=0)
        if need > con.width:
            con = Console(file=sys.stdout, highlight=False, markup=False, width=need)
        emit(con)
        return
    buf = io.StringIO()
    emit(Console(file=buf, width=200, highlight=False, markup=False, color_system=None, force_terminal=False))
    lines = [line.rstrip() for line in buf.getvalue().splitlines()]
    sys.stdout.write("\n".join(lines) + "\n")


class _Progress:
    """A rich progress bar on stderr for multi-item work, shown only on a terminal."""

    def __init__(self, total: int, label: str):
        self.bar = None
        if total > 1 and hasattr(sys.stderr, "isatty") and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=_console(stderr=True), transient=True,
            )
            self.task = self.bar.add_task(label, total=total)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def advance(self, description: str | None = None):
        if self.bar is not None:
            self.bar.update(self.task, advance=1, **({"description": description} if description else {}))

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


def _table(title=None, caption=None):
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, show_edge=False)
    t.gc_title, t.gc_caption = title, caption  # printed above/below by _show, unwrapped by the table's width
    return t


def _json_clean(obj):
    """Strict JSON: non-finite floats become null."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    return obj


def _print_json(obj) -> None:
    import json

    print(json.dumps(_json_clean(obj), indent=2, allow_nan=False, default=str))


def _n(v: int) -> str:
    return f"{v:,}"


def _ratio(v: float) -> str:
    return "-" if v != v else f"{v:.2f}x" if v < 1000 else f"{v:,.0f}x"


def _sci(v: float) -> str:
    return "-" if v != v else "0" if v == 0 else f"{v:.2e}"


def _cos(v: float) -> str:
    return "-" if v != v else f"{v:.6f}"


def _gbps(v: float) -> str:
    return "-" if v != v else f"{v:.3g}"


def _spec_list(text: str) -> list[str]:
    """Split ``a,b(x=1,y=2),c`` on the commas outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur.append(ch)
    out.append("".join(cur).strip())
    specs = [s for s in out if s]
    if not specs:
        raise UsageError("--codecs: expected a comma-separated list of specs, e.g. 'fp16,zstd'")
    return specs


# ============================================================================ measurement
class _Stats:
    """Sizes, error sums and times of one or more tensors; ``row()`` gives the table/JSON row."""

    def __init__(self):
        self.tensors = 0
        self.elements = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.sse = 0.0  # sum (y - x)^2
        self.sxx = 0.0
        self.syy = 0.0
        self.sxy = 0.0
        self.max_abs = 0.0
        self.t_enc = 0.0
        self.t_dec = 0.0

    def add(self, other: "_Stats") -> None:
        for k in ("tensors", "elements", "bytes_in", "bytes_out", "sse", "sxx", "syy", "sxy", "t_enc", "t_dec"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.max_abs = max(self.max_abs, other.max_abs) if other.max_abs == other.max_abs else other.max_abs

    def row(self, name: str) -> dict:
        import math

        if self.sxx > 0:
            rel = math.sqrt(self.sse / self.sxx) if self.sse == self.sse else math.nan
        else:
            rel = 0.0 if self.sse == 0 else math.inf if self.sse == self.sse else math.nan
        if self.sxx > 0 and self.syy > 0:
            cos = self.sxy / math.sqrt(self.sxx * self.syy)
        elif self.sxx == 0 and self.syy == 0:
            cos = 1.0
        else:
            cos = 0.0
        return {
            "name": name,
            "tensors": self.tensors,
            "elements": self.elements,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "ratio": self.bytes_in / self.bytes_out if self.bytes_out else math.nan,
            "rel_l2_error": rel,
            "cosine": cos,
            "max_abs_error": self.max_abs,
            "encode_gbps": self.bytes_in / self.t_enc / 1e9 if self.t_enc > 0 else math.nan,
            "decode_gbps": self.bytes_in / self.t_dec / 1e9 if self.t_dec > 0 else math.nan,
        }


def _measure_all(c, tensors: dict, repeat: int, step=None) -> list:
    """Encode and decode every tensor with codec ``c``; returns one :class:`_Stats` per tensor.

    A first pass encodes and decodes each tensor untimed (the warm-up: Numba compiles there)
    and measures sizes and errors in float64.  Then ``repeat`` timed rounds go over all
    tensors, keeping each tensor's best encode and decode time; taking the rounds across the
    whole set (not ``repeat`` calls in a row) keeps one burst of machine noise from spoiling
    every timing of one tensor.  The garbage collector is off while timing, as in timeit.
    ``step()`` is called after each tensor of the first pass (progress).  A tensor the codec
    refuses raises DataError naming it.
    """
    import gc
    import time

    import numpy as np

    import codec

    done = []
    for name, x in tensors.items():
        try:
            frame = c.encode(x)
            y = codec.decode(frame)
        except (ValueError, TypeError, codec.CodecError) as e:
            raise DataError(f"tensor {name!r:.200}: {e}") from None
        s = _Stats()
        s.tensors, s.elements, s.bytes_in, s.bytes_out = 1, int(x.size), int(x.nbytes), len(frame)
        s.t_enc = s.t_dec = float("inf")
        xd = np.asarray(x, dtype=np.float64).reshape(-1)
        yd = np.asarray(y, dtype=np.float64).reshape(-1)
        if xd.size != yd.size:
            raise DataError(f"tensor {name!r:.200}: decoded {yd.size} elements, encoded {xd.size}")
        with np.errstate(all="ignore"):
            same = (xd == yd) | (np.isnan(xd) & np.isnan(yd))  # exact NaN/inf round trips count as no error
            d = np.where(same, 0.0, yd - xd)
            s.sse = float(np.dot(d, d))
            s.sxx = float(np.dot(xd, xd))
            s.syy = float(np.dot(yd, yd))
            s.sxy = float(np.dot(xd, yd))
            s.max_abs = float(np.max(np.abs(d))) if d.size else 0.0
        done.append((x, frame, s))
        if step is not None:
            step()
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for x, frame, s in done:
                t0 = time.perf_counter()
                c.encode(x)
                t1 = time.perf_counter()
                codec.decode(frame)
                t2 = time.perf_counter()
                s.t_enc, s.t_dec = min(s.t_enc, t1 - t0), min(s.t_dec, t2 - t1)
    finally:
        if gc_was_on:
            gc.enable()
    return [s for _, _, s in done]


def _stats_table(title, rows, first: str, caption=None, extra=None):
    from rich.text import Text

    t = _table(title, caption)
    t.add_column(first, overflow="fold")
    for col in extra or ():
        t.add_column(col[0], justify=col[1])
    for h in ("elements", "bytes in", "bytes out", "ratio", "rel L2 err", "cosine", "max abs err", "enc GB/s", "dec GB/s"):
        t.add_column(h, justify="right")
    for r in rows:
        if "error" in r:
            t.add_row(_label(r["name"]), *[str(r.get(c[2], "")) for c in extra or ()], Text(f"failed: {r['error']}", style="red"))
            continue
        t.add_row(
            _label(r["name"]),
            *[str(r.get(c[2], "")) for c in extra or ()],
            _n(r["elements"]), _n(r["bytes_in"]), _n(r["bytes_out"]), _ratio(r["ratio"]),
            _sci(r["rel_l2_error"]), _cos(r["cosine"]), _sci(r["max_abs_error"]), _gbps(r["encode_gbps"]), _gbps(r["decode_gbps"]),
            style="bold" if r.get("_total") else None,
            end_section=bool(r.get("_before_total")),
        )
    return t


def _encode_one(c, name: str, x):
    from codec.errors import CodecError

    try:
        return c.encode(x)
    except (ValueError, TypeError, CodecError) as e:
        raise DataError(f"tensor {name!r:.200}: {e}") from None


# ============================================================================ commands
def cmd_list(args) -> int:
    import codec

    codecs = codec.list_codecs()
    if args.json:
        _print_json(codecs)
        return EXIT_OK
    t = _table(
        f"{len(codecs)} registered codecs (combine them with '+': e.g. topk(ratio=0.001)+fp16+zstd; "
        "~ marks a parameter that may be a schedule, e.g. ratio=warmup(0.25,0.001,steps=1000))"
    )
    for h in ("id", "kind", "lossless", "parameters (default)", "description"):
        t.add_column(h, overflow="fold")
    for c in codecs:
        params = []
        for p in c["params"]:
            text = f"{p['name']}={'auto' if p.get('auto') else p['default']}"
            if "choices" in p:
                text += " (" + "|".join(map(str, p["choices"])) + ")"
            elif "min" in p or "max" in p:
                text += f" ({p.get('min', '')}..{p.get('max', '')})"
            if p.get("schedule"):
                text += " ~"
            params.append(text)
        t.add_row(c["id"], c["kind"], "yes" if c["lossless"] else "no", ", ".join(params) or "-", c["doc"])
    _show(t)
    return EXIT_OK


def cmd_encode(args) -> int:
    from codec.container import pack_frames

    c = _codec(args.spec)
    _refuse_overwrite(args.output, args.input)
    tensors = _read_tensors(args.input)
    bytes_in = sum(int(x.nbytes) for x in tensors.values())
    if len(tensors) == 1 and not args.container:
        ((name, x),) = tensors.items()
        out = _encode_one(c, name, x)
        kind = "frame"
    else:
        _check_container_names(args.output, tensors)
        frames = []
        with _Progress(len(tensors), f"encoding with {c.spec}") as bar:
            for name, x in tensors.items():
                frames.append((name, _encode_one(c, name, x)))
                bar.advance()
        try:
            out = pack_frames(frames)
        except (ValueError, TypeError) as e:
            raise DataError(f"cannot write {args.output}: {e}") from None
        kind = "container"
    _write_bytes(args.output, out)
    ratio = bytes_in / len(out) if out else float("nan")
    print(
        f"{args.input} -> {args.output} ({kind}, {len(tensors)} tensor{'s' * (len(tensors) != 1)}, {c.spec}): "
        f"{_n(bytes_in)} bytes in, {_n(len(out))} bytes out, ratio {_ratio(ratio)}"
    )
    return EXIT_OK


def _frames_of(path: str, buf) -> tuple[bool, list]:
    """(is_container, [(name, frame)]) of a frame file; a bare frame is named by the file stem."""
    from codec.container import is_container, unpack_frames

    from codec.errors import CorruptFrameError

    if is_container(buf):
        try:
            return True, unpack_frames(buf)
        except CorruptFrameError as e:
            raise DataError(f"{path}: {e}") from None
    return False, [(os.path.splitext(os.path.basename(path))[0], memoryview(buf))]


def _decode_one(name: str, frame, in_container: bool):
    import codec

    try:
        return codec.decode(frame)
    except (ValueError, TypeError, codec.CodecError) as e:
        raise DataError(f"tensor {name!r:.200}: {e}" if in_container else str(e)) from None


def cmd_decode(args) -> int:
    ext = _check_out_ext(args.output)
    _refuse_overwrite(args.output, args.input)
    buf = _read_bytes(args.input)
    boxed, frames = _frames_of(args.input, buf)
    if ext == ".npy" and len(frames) != 1:
        raise UsageError(
            f"{args.input} is a container of {len(frames)} tensors; a .npy file holds exactly one, use -o NAME.npz or NAME.safetensors"
        )
    _check_names(args.output, [name for name, _ in frames])
    tensors = {}
    with _Progress(len(frames), "decoding") as bar:
        for name, frame in frames:
            tensors[name] = _decode_one(name, frame, boxed)
            bar.advance()
    _write_tensors(args.output, tensors)
    raw = sum(int(x.nbytes) for x in tensors.values())
    print(
        f"{args.input} -> {args.output} ({len(tensors)} tensor{'s' * (len(tensors) != 1)}): "
        f"{_n(len(buf))} bytes in, {_n(raw)} bytes out"
    )
    return EXIT_OK


def _inspect(name: str, frame, in_container: bool) -> dict:
    import codec
    from codec.dtypes import NAMES

    try:
        d = codec.inspect(frame)
    except (ValueError, TypeError, codec.CodecError) as e:
        raise DataError(f"tensor {name!r:.200}: {e}" if in_container else str(e)) from None
    d["raw_bytes"] = d["elements"] * NAMES[d["dtype"]].itemsize
    return d


def cmd_info(args) -> int:
    buf = _read_bytes(args.input)
    boxed, frames = _frames_of(args.input, buf)
    infos = [(name, _inspect(name, f, boxed)) for name, f in frames]
    if not boxed:
        d = infos[0][1]
        if args.json:
            _print_json(d)
            return EXIT_OK
        t = _table(f"{args.input}: gradcodec frame, format version {d['format_version']}")
        t.add_column("field")
        t.add_column("value", overflow="fold")
        for k, v in (
            ("codec", _label(d["codec"])),
            ("dtype", d["dtype"]),
            ("shape", "(" + ", ".join(map(str, d["shape"])) + ("," if len(d["shape"]) == 1 else "") + ")"),
            ("elements", _n(d["elements"])),
            ("raw bytes", _n(d["raw_bytes"])),
            ("header bytes", _n(d["header_bytes"])),
            ("payload bytes", _n(d["payload_bytes"])),
            ("frame bytes", _n(d["frame_bytes"])),
            ("ratio", _ratio(d["raw_bytes"] / d["frame_bytes"])),
            ("payload checksum", d["payload_checksum"] or "none"),
        ):
            t.add_row(k, v)
        s = _table("sections")
        for h, j in (("#", "right"), ("kind", "left"), ("encoding", "left"), ("bits", "right"), ("count", "right"),
                     ("raw bytes", "right"), ("stored bytes", "right")):
            s.add_column(h, justify=j)
        for i, sec in enumerate(d["sections"]):
            s.add_row(str(i), sec["kind"], sec["encoding"], str(sec["bits"]), _n(sec["count"]), _n(sec["raw_bytes"]), _n(sec["stored_bytes"]))
        _show(t, s)
        return EXIT_OK
    frame_total = sum(d["frame_bytes"] for _, d in infos)
    summary = {
        "format_version": 1,
        "count": len(infos),
        "container_bytes": len(buf),
        "header_bytes": len(buf) - frame_total,
        "elements": sum(d["elements"] for _, d in infos),
        "raw_bytes": sum(d["raw_bytes"] for _, d in infos),
    }
    if args.json:
        _print_json({"container": summary, "tensors": [{"name": n, **d} for n, d in infos]})
        return EXIT_OK
    t = _table(
        f"{args.input}: gradcodec container, format version 1, {len(infos)} tensor{'s' * (len(infos) != 1)}",
        caption=f"total bytes include the {_n(summary['header_bytes'])}-byte container header, table and checksums",
    )
    for h, j in (("name", "left"), ("codec", "left"), ("dtype", "left"), ("shape", "left"), ("elements", "right"),
                 ("raw bytes", "right"), ("frame bytes", "right"), ("ratio", "right")):
        t.add_column(h, justify=j, overflow="fold")
    for i, (name, d) in enumerate(infos):
        t.add_row(
            _label(name), _label(d["codec"]), d["dtype"], "x".join(map(str, d["shape"])) or "()", _n(d["elements"]), _n(d["raw_bytes"]),
            _n(d["frame_bytes"]), _ratio(d["raw_bytes"] / d["frame_bytes"]), end_section=i == len(infos) - 1,
        )
    ratio = summary["raw_bytes"] / len(buf)
    t.add_row("TOTAL", "", "", "", _n(summary["elements"]), _n(summary["raw_bytes"]), _n(len(buf)), _ratio(ratio), style="bold")
    _show(t)
    return EXIT_OK


def cmd_roundtrip(args) -> int:
    c = _codec(args.spec)
    tensors = _read_tensors(args.input)
    rows, total = [], _Stats()
    with _Progress(len(tensors), f"round trip with {c.spec}") as bar:
        stats = _measure_all(c, tensors, args.repeat, bar.advance)
    for name, st in zip(tensors, stats):
        total.add(st)
        row = st.row(name)
        del row["tensors"]
        rows.append(row)
    tot = total.row("TOTAL")
    if args.json:
        _print_json({"codec": c.spec, "lossless": c.lossless, "input": args.input, "rows": rows, "total": tot})
        return EXIT_OK
    if rows:
        rows[-1]["_before_total"] = True
    tot["_total"] = True
    title = f"round trip of {args.input} with {c.spec} ({'lossless' if c.lossless else 'lossy'})"
    caption = "bytes out: whole frames, headers included; ratio = bytes in / bytes out; speeds: raw bytes / best of " \
              f"{args.repeat} timed round{'s' * (args.repeat != 1)} over all tensors, after one untimed warm-up"
    _show(_stats_table(title, rows + [tot], "tensor", caption))
    return EXIT_OK


#: pipelines the demo runs after one default spec per registered codec id
DEMO_PIPELINES = (
    "fp16+zstd",
    "bf16+zstd",
    "threshold(value=0.001)+fp16+zstd",
    "topk(ratio=0.001)+fp16+zstd",
    "gaussiank(ratio=0.05)+bf16",
    "adacomp+zstd",
    "qsgd+zstd",
    "topk(ratio=0.01)+rangefloat",
)


def _demo_specs() -> list[str]:
    import codec

    return [c["id"] for c in codec.list_codecs()] + list(DEMO_PIPELINES)


def cmd_demo(args) -> int:
    import codec
    from codec import sample

    if args.codecs is not None:
        specs = _spec_list(args.codecs)
        codecs = [(s, _codec(s)) for s in specs]  # a bad user spec is a usage error, before any work
    else:
        codecs = []
        for s in _demo_specs():
            try:
                codecs.append((s, codec.get_codec(s)))
            except (ValueError, TypeError, codec.CodecError) as e:
                codecs.append((s, e))
    try:
        grads = sample.load_sample()
    except OSError as e:
        raise DataError(f"cannot load the bundled sample: {e}") from None
    n_el = sum(int(x.size) for x in grads.values())
    n_b = sum(int(x.nbytes) for x in grads.values())
    dtypes = sorted({str(x.dtype) for x in grads.values()})
    rows, failed = [], 0
    with _Progress(len(codecs) * len(grads), "demo") as bar:
        for label, c in codecs:
            if isinstance(c, Exception):
                rows.append({"name": label, "error": str(c)})
                failed += 1
                continue
            total = _Stats()
            try:
                for st in _measure_all(c, grads, args.repeat, lambda: bar.advance(f"demo: {c.spec}")):
                    total.add(st)
            except DataError as e:
                rows.append({"name": c.spec, "error": str(e)})
                failed += 1
                continue
            row = total.row(c.spec)
            row["lossless"] = c.lossless
            rows.append(row)
    about = (
        f"{len(grads)} {'/'.join(dtypes)} gradient tensors ({_n(n_el)} elements, {_n(n_b)} bytes) "
        "of a small CNN trained on scikit-learn digits, 4 training steps (codec.sample)"
    )
    if args.json:
        _print_json({"sample": {"tensors": len(grads), "elements": n_el, "bytes": n_b, "about": about}, "rows": rows})
    else:
        for r in rows:
            if "lossless" in r:
                r["lossless"] = "yes" if r["lossless"] else "no"
        caption = (
            "one TOTAL row per codec over all tensors: bytes out = whole frames, headers included; ratio = bytes in / "
            f"bytes out; rel L2 err = ||y-x||/||x|| and cosine over the concatenation; speeds = raw bytes / best of "
            f"{args.repeat} timed round{'s' * (args.repeat != 1)} over all tensors, after one untimed warm-up"
        )
        _show(_stats_table(f"gradcodec demo: {about}", rows, "codec", caption, extra=[("lossless", "center", "lossless")]))
    return EXIT_DATA if failed else EXIT_OK


# ============================================================================ parser and main
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Gradient compression into self-describing byte frames: encode, decode, inspect and measure codecs.",
        epilog="Exit status: 0 ok, 1 bad data (missing/corrupt file), 2 usage (bad arguments, spec or codec), "
        "3 internal error, 130 interrupted.  Tensor files: .npy, .npz, .safetensors.  See docs/cli.md.",
    )
    p.add_argument("--version", action=_Version, help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    sp = sub.add_parser("list", help="list registered codecs with their parameters", description="List the registered codecs (stages).")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser(
        "encode", help="encode a tensor file into a frame (one tensor) or a container (several)",
        description="Encode every tensor of INPUT with SPEC.  One tensor gives a single frame, several a container of named frames.",
    )
    sp.add_argument("spec", metavar="SPEC", help="codec spec, e.g. 'fp16+zstd' or 'threshold(value=0.001)+fp16+zstd'")
    sp.add_argument("input", metavar="INPUT", help="tensor file: .npy, .npz or .safetensors")
    sp.add_argument("-o", "--output", metavar="OUT", required=True, help="output file (any name; .gcf/.gcc by convention)")
    sp.add_argument("--container", action="store_true", help="write a container even for a single tensor (keeps its name)")
    sp.set_defaults(func=cmd_encode)

    sp = sub.add_parser(
        "decode", help="decode a frame or container into .npy/.npz/.safetensors",
        description="Decode a frame (to .npy, .npz or .safetensors) or a container (to .npz or .safetensors, names kept).",
    )
    sp.add_argument("input", metavar="FRAMEFILE", help="a frame or container written by 'gradcodec encode'")
    sp.add_argument("-o", "--output", metavar="OUT", required=True, help="output tensor file: .npy, .npz or .safetensors")
    sp.set_defaults(func=cmd_decode)

    sp = sub.add_parser("info", help="show the header of a frame or container", description="Show a frame's header (or one row per tensor of a container); nothing is decoded.")
    sp.add_argument("input", metavar="FRAMEFILE")
    sp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sp.set_defaults(func=cmd_info)

    sp = sub.add_parser(
        "roundtrip", help="encode+decode every tensor of a file: ratio, error, speed",
        description="Encode and decode every tensor of INPUT with SPEC and report size, ratio, error and speed per tensor and in total.",
    )
    sp.add_argument("spec", metavar="SPEC")
    sp.add_argument("input", metavar="INPUT", help="tensor file: .npy, .npz or .safetensors")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--repeat", type=_positive_int, default=3, metavar="N", help="timed rounds over all tensors, best time per tensor kept (default 3)")
    sp.set_defaults(func=cmd_roundtrip)

    sp = sub.add_parser(
        "demo", help="run codecs on the bundled sample of real gradients",
        description="Run every registered codec (default parameters) and a few pipelines on the bundled gradient sample; one total row per codec.",
    )
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--codecs", metavar="SPEC,SPEC...", help="comma-separated specs to run instead of the default set")
    sp.add_argument("--repeat", type=_positive_int, default=3, metavar="N", help="timed rounds over all tensors, best time per tensor kept (default 3)")
    sp.set_defaults(func=cmd_demo)
    return p


def _error(msg: str) -> None:
    text = " ".join(str(msg).split()) or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr)


def _os_message(e: OSError) -> str:
    what = e.strerror or str(e)
    return f"{e.filename}: {what}" if e.filename else what


def main(argv=None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    for stream in (sys.stdout, sys.stderr):  # a name or path the terminal cannot encode is escaped, not a crash
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help, --version
            return e.code if isinstance(e.code, int) else EXIT_OK
        return args.func(args)
    except UsageError as e:
        _error(e)
        return EXIT_USAGE
    except DataError as e:
        _error(e)
        return EXIT_DATA
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except MemoryError as e:
        _error(f"not enough memory{': ' + str(e) if str(e) else ''}")
        return EXIT_DATA
    except BrokenPipeError:
        try:  # stdout went away (e.g. '| head'): stop quietly, and keep Python from complaining at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return EXIT_DATA
    except OSError as e:
        _error(_os_message(e))
        return EXIT_DATA
    except Exception as e:  # noqa: BLE001  a bug: one line unless asked for the traceback
        import codec

        if os.environ.get("GRADCODEC_DEBUG"):
            raise
        if isinstance(e, codec.CodecError) or (isinstance(e, ValueError) and type(e).__module__.startswith("codec")):
            _error(e)
            return EXIT_DATA
        _error(f"internal error: {type(e).__name__}: {e} (set GRADCODEC_DEBUG=1 for a traceback; please report it)")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
