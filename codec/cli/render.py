"""What ``gradcodec`` prints: rich tables (plain text off a terminal), strict JSON, the
number formats of its tables and the progress bar on stderr.  rich is imported only when
something is drawn."""

from __future__ import annotations

import sys


def name_cell(name: str):
    """A tensor name for a table cell: as it is when printable, else its repr (so control
    characters, escapes and lone surrogates show as escapes); never parsed as rich markup."""
    from rich.text import Text

    return Text(name if name.isprintable() else repr(name))

def make_console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, highlight=False, markup=False)


def show(*renderables) -> None:
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


class ProgressBar:
    """Progress of multi-item work on stderr: a rich bar on a terminal; off one (a pipe, a
    file, CI) a plain line when an item starts after ``EVERY`` seconds without one.  Either
    way, one line says so when Numba compiles kernels for more than a second (the first run
    on a cold cache: :func:`compile_notice`).  ``describe(text)`` names the item under way,
    ``advance()`` counts one done."""

    EVERY = 10.0

    def __init__(self, total: int, label: str):
        import time

        self.bar, self.total, self.label, self.done, self.now = None, total, label, 0, None
        self.t0 = self.last = time.monotonic()
        self.plain = total > 1 and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
        if total > 1 and not self.plain:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=make_console(stderr=True), transient=True,
            )
            self.task = self.bar.add_task(label, total=total)
        self.notice = compile_notice(self.say) if total > 1 else None

    def say(self, line: str) -> None:
        """One line on stderr, above the bar when one is drawn."""
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        if self.notice is not None:
            self.notice.__enter__()
        return self

    def describe(self, text: str) -> None:
        """The item under way is ``text``."""
        self.now = text
        if self.bar is not None:
            self.bar.update(self.task, description=text)
        else:
            self._line()

    def advance(self, description: str | None = None):
        """One item done (``description``: the next under way)."""
        self.done += 1
        self.now = description or self.now
        if self.bar is not None:
            self.bar.update(self.task, advance=1, **({"description": description} if description else {}))
        else:
            self._line()

    def _line(self) -> None:
        """Off a terminal: where the work is, at most every ``EVERY`` seconds."""
        import time

        if self.plain and time.monotonic() - self.last >= self.EVERY:
            self.last = time.monotonic()
            now = f"; now {self.now}" if self.now and self.done < self.total else ""
            self.say(f"{self.label}: {self.done}/{self.total} done, {self.last - self.t0:.0f} s{now}")

    def __exit__(self, *exc):
        if self.notice is not None:
            self.notice.__exit__(*exc)
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


class compile_notice:
    """While entered, ``say(NOTICE)`` once if Numba spends more than ``after`` seconds in one
    compilation (a cold cache: loading a cached kernel takes milliseconds), from a timer
    started by Numba's ``numba:compile`` event.  Numba is imported on entering (the commands
    that show progress run kernels anyway)."""

    NOTICE = "compiling kernels (first run only: Numba caches them, later runs start in about a second) ..."

    def __init__(self, say, after: float = 1.0):
        self.say, self.after, self.said, self.timer, self.depth = say, after, False, None, 0

    def __enter__(self):
        from numba.core import event

        listener = self

        class _Listener(event.Listener):
            def on_start(self, ev):
                listener._start()

            def on_end(self, ev):
                listener._end()

        self._listener = _Listener()
        event.register("numba:compile", self._listener)
        return self

    def _start(self) -> None:
        import threading

        self.depth += 1
        if self.depth == 1 and not self.said:
            self.timer = threading.Timer(self.after, self._fire)
            self.timer.daemon = True
            self.timer.start()

    def _end(self) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self) -> None:
        if not self.said:
            self.said = True
            self.say(self.NOTICE)

    def __exit__(self, *exc):
        from numba.core import event

        event.unregister("numba:compile", self._listener)
        if self.timer is not None:
            self.timer.cancel()
        return False


def table(title=None, caption=None):
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, show_edge=False)
    t.gc_title, t.gc_caption = title, caption  # printed above/below by show, unwrapped by the table's width
    return t


def json_clean(obj):
    """Strict JSON: non-finite floats become null."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    return obj


def print_json(obj) -> None:
    import json

    print(json.dumps(json_clean(obj), indent=2, allow_nan=False, default=str))


def fmt_int(v: int) -> str:
    return f"{v:,}"


def fmt_ratio(v: float) -> str:
    return "-" if v != v else f"{v:.2f}x" if v < 1000 else f"{v:,.0f}x"


def fmt_sci(v: float) -> str:
    return "-" if v != v else "0" if v == 0 else f"{v:.2e}"


def fmt_cos(v: float) -> str:
    return "-" if v != v else f"{v:.6f}"


def fmt_gbps(v: float) -> str:
    return "-" if v != v else f"{v:.3g}"


def stats_table(title, rows, first: str, caption=None, extra=None):
    from rich.text import Text

    t = table(title, caption)
    t.add_column(first, overflow="fold")
    for col in extra or ():
        t.add_column(col[0], justify=col[1])
    for h in ("elements", "bytes in", "bytes out", "ratio", "rel L2 err", "cosine", "max abs err", "enc GB/s", "dec GB/s"):
        t.add_column(h, justify="right")
    for r in rows:
        if "error" in r:
            t.add_row(name_cell(r["name"]), *[str(r.get(c[2], "")) for c in extra or ()], Text(f"failed: {r['error']}", style="red"))
            continue
        t.add_row(
            name_cell(r["name"]),
            *[str(r.get(c[2], "")) for c in extra or ()],
            fmt_int(r["elements"]), fmt_int(r["bytes_in"]), fmt_int(r["bytes_out"]), fmt_ratio(r["ratio"]),
            fmt_sci(r["rel_l2_error"]), fmt_cos(r["cosine"]), fmt_sci(r["max_abs_error"]), fmt_gbps(r["encode_gbps"]), fmt_gbps(r["decode_gbps"]),
            style="bold" if r.get("_total") else None,
            end_section=bool(r.get("_before_total")),
        )
    return t

