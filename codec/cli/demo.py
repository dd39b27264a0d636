"""``gradcodec demo``: every codec on the bundled sample of real gradients, grouped by family,
each measured on one step (size, direction, error, speed) and over eight consecutive steps
(how well the sum of the decoded steps tracks the true sum, with error feedback and without),
with a legend of what the numbers mean (docs/cli.md, "demo")."""

from __future__ import annotations

from codec.cli.errors import EXIT_DATA, EXIT_OK, DataError, UsageError
from codec.cli.files import user_codec
from codec.cli.measure import Stats, measure_all, track
from codec.cli.render import ProgressBar, fmt_cos, fmt_gbps, fmt_int, fmt_ratio, fmt_sci, name_cell, print_json, show, table

#: the demo's rows, by family: each codec at its default (threshold at a value: its default
#: 0 keeps everything) and the pipelines worth seeing; a registered codec listed nowhere
#: here is shown under "other" at its default, so none is left out
FAMILIES = (
    ("lossless", ("none", "none+crc32", "none+zstd")),
    ("16- and 8-bit floats", ("fp16", "bf16", "fp16+zstd", "bf16+zstd", "rangefloat", "fp8", "fp8(scale=true)")),
    ("quantizers", ("minmax", "qsgd", "qsgd+zstd", "terngrad")),
    ("sign (one bit a value)", ("sign", "efsign", "onebit")),
    ("sparsifiers", (
        "topk", "topk(ratio=0.001)+fp16+zstd", "topk(ratio=0.01)+rangefloat", "dgc", "gaussiank", "gaussiank(ratio=0.05)+bf16",
        "randomk", "threshold(value=0.001)", "threshold(value=0.001)+fp16+zstd", "adacomp", "adacomp+zstd",
    )),
    ("low rank and spectral", ("powersgd", "fft")),
)

#: what a newcomer needs to read the table (printed under it)
LEGEND = (
    "ratio = bytes in / bytes out (whole frames, headers included).",
    "one step: cosine of the decoded gradient with the true one (1 = the same direction) and rel L2 err = ||y-x|| / ||x||.",
    "8 steps: the sum of 8 consecutive decoded steps against the true sum, ||sum y - sum x|| / ||sum x||, with error feedback "
    "(codec.ErrorFeedback: what a step drops is added to the next; how these codecs are meant to train) and without.",
    "A sparsifier or a 1-bit code loses most of one step by design (0.5-0.9 is normal): under error feedback what it drops "
    "is sent in later steps, so its 8-step error is lower, and falls further over more steps. A lossless codec shows 0.",
    "* direction only: sign decodes to +-1 (signSGD: the learning rate carries the scale), so its errors are measured after "
    "the best scale, sqrt(1 - cosine^2); unscaled signs pile up in an error-feedback residual: under error feedback use "
    "efsign (or sign(scale=l1)), which decodes with a scale.",
    "threshold is shown at value=0.001: its default, value=0, keeps every element (pick the threshold for your gradients' scale).",
    "fp8 without a scale (its default, the OCP format as it is) flushes |x| < 2^-9 (e4m3) to zero: late in training most "
    "gradients are that small (at the sample's last step it zeroes 99.97% of them), so send gradients with fp8(scale=true).",
)


def spec_list(text: str) -> list[str]:
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


def demo_rows() -> list[tuple[str, str]]:
    """``(family, spec)`` of the default demo: :data:`FAMILIES`, then any registered codec
    whose id heads none of their specs ("other")."""
    import codec

    rows = [(fam, s) for fam, specs in FAMILIES for s in specs]
    shown = {codec.parse_spec(s)[0][0] for _, s in rows} | {"crc32", "zstd"}  # (the byte stages: after none)
    return rows + [("other", c["id"]) for c in codec.list_codecs() if c["id"] not in shown]


def direction_only(c) -> bool:
    """Whether codec ``c`` decodes a direction without a scale (``sign`` at ``scale=none``)."""
    import codec

    head, params = codec.parse_spec(c.spec)[0]
    return head == "sign" and params.get("scale", "none") == "none"


def cmd_demo(args) -> int:
    import codec
    from codec import sample

    if args.codecs is not None:
        codecs = [(None, s, user_codec(s)) for s in spec_list(args.codecs)]  # a bad user spec is a usage error, before any work
    else:
        codecs = []
        for fam, s in demo_rows():
            try:
                codecs.append((fam, s, codec.get_codec(s)))
            except codec.CodecError as e:
                codecs.append((fam, s, e))
    try:
        grads = sample.load_sample()
        steps = sample.load_steps()
    except OSError as e:
        raise DataError(f"cannot load the bundled sample: {e}") from None
    n_el = sum(int(x.size) for x in grads.values())
    n_b = sum(int(x.nbytes) for x in grads.values())
    dtypes = sorted({str(x.dtype) for x in grads.values()})
    rows, failed = [], 0
    with ProgressBar(len(codecs), "demo") as bar:
        for fam, label, c in codecs:
            bar.describe(label)
            row = _measure(c, label, grads, steps, args.repeat)
            row["family"] = fam
            failed += "error" in row
            rows.append(row)
            bar.advance()
    about = (
        f"{len(grads)} {'/'.join(dtypes)} gradient tensors ({fmt_int(n_el)} elements, {fmt_int(n_b)} bytes) "
        f"of a small CNN trained on scikit-learn digits at 4 points of training, and {len(steps)} consecutive steps (codec.sample)"
    )
    if args.json:
        print_json({"sample": {"tensors": len(grads), "elements": n_el, "bytes": n_b, "steps": len(steps), "about": about}, "rows": rows})
    else:
        show(_table(f"gradcodec demo: {about}", rows, args.repeat))
    return EXIT_DATA if failed else EXIT_OK


def _measure(c, label: str, grads: dict, steps: list, repeat: int) -> dict:
    """One demo row: the one-step totals (``Stats.row``) and the 8-step sums' errors; an
    ``error`` row when the codec cannot be made or refuses a tensor."""
    if isinstance(c, Exception):
        return {"name": label, "error": str(c)}
    total = Stats()
    try:
        for st in measure_all(c, grads, repeat):
            total.add(st)
        ef, plain = track(c, steps, feedback=True), track(c, steps, feedback=False)
    except DataError as e:
        return {"name": c.spec, "error": str(e)}
    row = total.row(c.spec)
    row["lossless"] = c.lossless
    row["direction_only"] = direction_only(c)
    pick = _sine if row["direction_only"] else None  # (a direction: its error after the best scale)
    row["steps_error_ef"] = pick(ef[1]) if pick else ef[0]
    row["steps_error"] = pick(plain[1]) if pick else plain[0]
    row["steps_cosine_ef"], row["steps_cosine"] = ef[1], plain[1]
    return row


def _sine(cos: float) -> float:
    """The relative error left after the best scale: sqrt(1 - cos^2)."""
    import math

    return math.sqrt(max(0.0, 1.0 - cos * cos)) if cos == cos else math.nan


def _table(title: str, rows: list, repeat: int):
    from rich.text import Text

    t = table(title, "\n".join(LEGEND + (f"speeds: raw bytes / best of {repeat} timed round{'s' * (repeat != 1)} over the sample, after one untimed warm-up.",)))
    for h, j in (("codec", "left"), ("bytes out", "right"), ("ratio", "right"), ("cosine", "right"), ("rel L2 err", "right"),
                 ("8 steps, EF", "right"), ("8 steps, no EF", "right"), ("enc GB/s", "right"), ("dec GB/s", "right")):
        t.add_column(h, justify=j, overflow="fold")
    family = object()
    for r in rows:
        if r.get("family") != family and r.get("family") is not None:
            t.add_row(Text(r["family"], style="bold"), end_section=False)
        family = r.get("family")
        if "error" in r:
            t.add_row(name_cell(r["name"]), Text(f"failed: {r['error']}", style="red"))
            continue
        star = r["direction_only"]
        err = _sine(r["cosine"]) if star else r["rel_l2_error"]
        t.add_row(
            name_cell("  " + r["name"] + (" *" if star else "")), fmt_int(r["bytes_out"]), fmt_ratio(r["ratio"]), fmt_cos(r["cosine"]),
            fmt_sci(err), fmt_sci(r["steps_error_ef"]), fmt_sci(r["steps_error"]), fmt_gbps(r["encode_gbps"]), fmt_gbps(r["decode_gbps"]),
        )
    return t
