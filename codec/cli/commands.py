"""The subcommands of ``gradcodec``: ``cmd_NAME(args) -> exit status``, one per command."""

from __future__ import annotations

from codec.cli.errors import EXIT_OK, DataError, UsageError
from codec.cli.files import (
    check_container_names, check_names, check_out_ext, read_bytes, read_input, refuse_overwrite, user_codec, write_bytes,
    write_output,
)
from codec.cli.measure import Stats, measure_all, track
from codec.cli.render import (
    ProgressBar, fmt_int, fmt_ratio, fmt_sci, name_cell, print_json, show, stats_table, table,
)
from codec.errors import CodecError


def _encode_one(c, name: str, x):
    try:
        return c.encode(x)
    except CodecError as e:
        raise DataError(f"tensor {name!r:.200}: {e}") from None


def cmd_list(args) -> int:
    import codec

    codecs = codec.list_codecs()
    if args.json:
        print_json(codecs)
        return EXIT_OK
    t = table(
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
    show(t)
    return EXIT_OK


def cmd_encode(args) -> int:
    from codec.container import pack_frames

    c = user_codec(args.spec)
    refuse_overwrite(args.output, args.input)
    tensors = read_input(args.input)
    bytes_in = sum(int(x.nbytes) for x in tensors.values())
    if args.many:
        try:
            out = bytes(c.encode_many(tensors))
        except CodecError as e:
            raise DataError(f"cannot encode {args.input} as one frame: {e}") from None
        kind = "many-tensor frame"
    elif len(tensors) == 1 and not args.container:
        ((name, x),) = tensors.items()
        out = _encode_one(c, name, x)
        kind = "frame"
    else:
        check_container_names(args.output, tensors)
        frames = []
        with ProgressBar(len(tensors), f"encoding with {c.spec}") as bar:
            for name, x in tensors.items():
                frames.append((name, _encode_one(c, name, x)))
                bar.advance()
        try:
            out = pack_frames(frames)
        except CodecError as e:
            raise DataError(f"cannot write {args.output}: {e}") from None
        kind = "container"
    write_bytes(args.output, out)
    ratio = bytes_in / len(out) if out else float("nan")
    print(
        f"{args.input} -> {args.output} ({kind}, {len(tensors)} tensor{'s' * (len(tensors) != 1)}, {c.spec}): "
        f"{fmt_int(bytes_in)} bytes in, {fmt_int(len(out))} bytes out, ratio {fmt_ratio(ratio)}"
    )
    return EXIT_OK


def cmd_decode(args) -> int:
    from codec.cli.frames import read_frame_file

    ext = check_out_ext(args.output)
    refuse_overwrite(args.output, args.input)
    buf = read_bytes(args.input)
    ff = read_frame_file(args.input, buf)
    if ext == ".npy" and len(ff.tensors) != 1:
        what = "container" if ff.kind == "container" else "many-tensor frame"
        raise UsageError(
            f"{args.input} is a {what} of {len(ff.tensors)} tensors; a .npy file holds exactly one, use -o NAME.npz or NAME.safetensors"
        )
    check_names(args.output, ff.names)
    tensors = ff.decode()
    write_output(args.output, tensors)
    raw = sum(int(x.nbytes) for x in tensors.values())
    print(
        f"{args.input} -> {args.output} ({len(tensors)} tensor{'s' * (len(tensors) != 1)}): "
        f"{fmt_int(len(buf))} bytes in, {fmt_int(raw)} bytes out"
    )
    return EXIT_OK


def _shape_text(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _sections_table(sections):
    s = table("sections")
    for h, j in (("#", "right"), ("kind", "left"), ("encoding", "left"), ("bits", "right"), ("count", "right"),
                 ("raw bytes", "right"), ("stored bytes", "right")):
        s.add_column(h, justify=j)
    for i, sec in enumerate(sections):
        s.add_row(str(i), sec["kind"], sec["encoding"], str(sec["bits"]), fmt_int(sec["count"]), fmt_int(sec["raw_bytes"]), fmt_int(sec["stored_bytes"]))
    return s


def _size_rows(d: dict) -> tuple:
    """The rows of a frame's sizes, v1 or v2 (``codec.inspect``'s keys plus ``raw_bytes``)."""
    return (
        ("elements", fmt_int(d["elements"])),
        ("raw bytes", fmt_int(d["raw_bytes"])),
        ("header bytes", fmt_int(d["header_bytes"])),
        ("payload bytes", fmt_int(d["payload_bytes"])),
        ("frame bytes", fmt_int(d["frame_bytes"])),
        ("ratio", fmt_ratio(d["raw_bytes"] / d["frame_bytes"])),
        ("payload checksum", d["payload_checksum"] or "none"),
    )


def _fields_table(title: str, rows):
    t = table(title)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def cmd_info(args) -> int:
    from codec.cli.frames import read_frame_file

    buf = read_bytes(args.input)
    ff = read_frame_file(args.input, buf)
    d = ff.info
    if args.json:
        print_json({"container": d, "tensors": [{"name": n, **t} for n, t in ff.tensors]} if ff.kind == "container" else d)
        return EXIT_OK
    if ff.kind == "frame":
        show(_fields_table(f"{args.input}: gradcodec frame, format version {d['format_version']}", (
            ("codec", name_cell(d["codec"])),
            ("dtype", d["dtype"]),
            ("shape", _shape_text(d["shape"])),
            *_size_rows(d),
        )), _sections_table(d["sections"]))
        return EXIT_OK
    if ff.kind == "many":
        _show_many(args.input, d)
        return EXIT_OK
    infos = ff.tensors
    t = table(
        f"{args.input}: gradcodec container, format version 1, {len(infos)} tensor{'s' * (len(infos) != 1)}",
        caption=f"total bytes include the {fmt_int(d['header_bytes'])}-byte container header, table and checksums",
    )
    for h, j in (("name", "left"), ("codec", "left"), ("dtype", "left"), ("shape", "left"), ("elements", "right"),
                 ("raw bytes", "right"), ("frame bytes", "right"), ("ratio", "right")):
        t.add_column(h, justify=j, overflow="fold")
    for i, (name, x) in enumerate(infos):
        t.add_row(
            name_cell(name), name_cell(x["codec"]), x["dtype"], "x".join(map(str, x["shape"])) or "()", fmt_int(x["elements"]), fmt_int(x["raw_bytes"]),
            fmt_int(x["frame_bytes"]), fmt_ratio(x["raw_bytes"] / x["frame_bytes"]), end_section=i == len(infos) - 1,
        )
    ratio = d["raw_bytes"] / len(buf)
    t.add_row("TOTAL", "", "", "", fmt_int(d["elements"]), fmt_int(d["raw_bytes"]), fmt_int(len(buf)), fmt_ratio(ratio), style="bold")
    show(t)
    return EXIT_OK


def _show_many(path: str, d: dict) -> None:
    """``info`` of a many-tensor frame: its header, then one row per tensor (a joint frame's
    sections are its concatenation's, listed once)."""
    n = len(d["tensors"])
    head = _fields_table(f"{path}: gradcodec many-tensor frame, format version {d['format_version']}, {n} tensor{'s' * (n != 1)}", (
        ("codec", name_cell(d["codec"])),
        ("layout", "in the frame (table)" if d["layout"] == "table" else "by hash"),
        ("joint", "yes (one coding of the concatenation)" if d["joint"] else "no (each tensor coded as alone)"),
        ("payload", "one zstd frame" if d["compressed"] else "raw sections"),
        *_size_rows(d),
    ))
    t = table("tensors", caption=None if d["joint"] else "section bytes: the raw bytes of each tensor's sections (before zstd, when the payload is compressed)")
    for h, j in (("#", "right"), ("name", "left"), ("dtype", "left"), ("shape", "left"), ("elements", "right"), ("raw bytes", "right"),
                 ("sections", "right"), ("section bytes", "right")):
        t.add_column(h, justify=j, overflow="fold")
    for i, x in enumerate(d["tensors"]):
        secs = x.get("sections")
        t.add_row(
            str(i), "-" if x["name"] is None else name_cell(x["name"]), x["dtype"], "x".join(map(str, x["shape"])) or "()", fmt_int(x["elements"]),
            fmt_int(x["raw_bytes"]), "-" if secs is None else str(len(secs)), "-" if secs is None else fmt_int(sum(s["raw_bytes"] for s in secs)),
        )
    show(head, t, *([_sections_table(d["sections"])] if d["joint"] else []))


def cmd_roundtrip(args) -> int:
    c = user_codec(args.spec)
    tensors = read_input(args.input)
    rows, total = [], Stats()
    with ProgressBar(len(tensors), f"round trip with {c.spec}") as bar:
        stats = measure_all(c, tensors, args.repeat, bar.advance)
        steps = None
        if args.steps:
            sequence = as_steps(tensors, args.steps)
            ef, plain = track(c, sequence, feedback=True), track(c, sequence, feedback=False)
            steps = {"count": len(sequence), "error_ef": ef[0], "cosine_ef": ef[1], "error": plain[0], "cosine": plain[1]}
    for name, st in zip(tensors, stats):
        total.add(st)
        row = st.row(name)
        del row["tensors"]
        rows.append(row)
    tot = total.row("TOTAL")
    if args.json:
        print_json({"codec": c.spec, "lossless": c.lossless, "input": args.input, "rows": rows, "total": tot,
                    **({"steps": steps} if steps else {})})
        return EXIT_OK
    if rows:
        rows[-1]["_before_total"] = True
    tot["_total"] = True
    title = f"round trip of {args.input} with {c.spec} ({'lossless' if c.lossless else 'lossy'})"
    caption = "bytes out: whole frames, headers included; ratio = bytes in / bytes out; speeds: raw bytes / best of " \
              f"{args.repeat} timed round{'s' * (args.repeat != 1)} over all tensors, after one untimed warm-up"
    show(stats_table(title, rows + [tot], "tensor", caption))
    if steps:
        print(
            f"over {steps['count']} steps, the sum of the decoded steps against the true sum (||sum y - sum x|| / ||sum x||): "
            f"{fmt_sci(steps['error_ef'])} with error feedback, {fmt_sci(steps['error'])} without"
        )
    return EXIT_OK


def as_steps(tensors: dict, n: int) -> list:
    """The consecutive steps of ``roundtrip --steps N``: when every name is ``stepNNNN/...``
    (the bundled sample's names), the file's steps in order, the first ``n`` of them, each
    ``{rest of the name: tensor}``; otherwise the file's tensors as ``n`` steps alike."""
    import re

    found = [re.match(r"(step\d+)/(.+)", name, re.S) for name in tensors]
    if not tensors or not all(found):
        return [tensors] * n
    steps: dict = {}
    for m, x in zip(found, tensors.values()):
        steps.setdefault(m.group(1), {})[m.group(2)] = x
    return [steps[k] for k in sorted(steps, key=lambda k: int(k[4:]))][:n]
