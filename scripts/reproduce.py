"""The training reproductions of docs/evidence.md: run them, then make their tables and plots.

    pip install -e ".[reproduce]"                     # torch, scikit-learn, mnist1d, matplotlib, MPI
    python scripts/reproduce.py run --set full        # every configuration, 3 models, 3 seeds (about 40 minutes on 2 cores)
    python scripts/reproduce.py run --set reduced     # the claims' configurations, 1 seed, shorter runs (4 minutes)
    python scripts/reproduce.py run --set ddp         # the CNN through PyTorch's DDP and gradcodec's hook (2 minutes)
    python scripts/reproduce.py report                # results/*.json -> docs/img/*.png, tables on stdout
    python scripts/reproduce.py report --write docs/evidence.md   # the tables into the page, between its markers
    python scripts/reproduce.py costs                 # docs/choosing.md's cost-model table

``run`` launches one MPI job of 4 ranks a model (``mpiexec -n 4 python -m mpi4py
examples/reproduce/worker.py``), every configuration and seed in it, and writes
``results/<set>/<model>.json`` (``--tag T``: ``<model>-T.json``, beside the others: ``report``
reads every JSON file of the set).  ``report`` reads them, writes the figures into docs/img/
(``--img``) and prints the Markdown tables docs/evidence.md holds: per model and
configuration, the test metric's mean and spread over the seeds against uncompressed, the
bytes a rank sends a step, the compression of each layer type, and the time a step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "examples" / "reproduce" / "worker.py"

#: the models in the order the report shows them
ORDER = ["cnn", "mlp", "lstm"]
#: steps a run, per model (full set); the reduced set runs a quarter of them
STEPS = {"cnn": 300, "mlp": 600, "lstm": 400}
#: the configurations each claim needs (the reduced set), and the rest (each codec at its default)
CLAIMS = ["dense", "topk-1%", "topk-0.1%", "dgc-0.1%", "gaussiank-1%", "adacomp", "fft-0.99", "fft-0.99-diminishing",
          "rangefloat-8", "powersgd-2", "powersgd-2-warm", "qsgd", "terngrad", "pufferfish", "pufferfish-warm"]
DEFAULTS = ["fp16", "efsign", "randomk-1%", "minmax-4"]
SETS = {
    "full": {"configs": CLAIMS + DEFAULTS, "seeds": "0,1,2", "scale": 1.0, "models": ["cnn", "mlp", "lstm"], "ranks": 4},
    "reduced": {"configs": CLAIMS, "seeds": "0", "scale": 0.25, "models": ["cnn", "mlp", "lstm"], "ranks": 4},
    "smoke": {"configs": ["dense", "topk-1%", "pufferfish"], "seeds": "0", "scale": 0.04, "models": ["cnn"], "ranks": 2},
    # the same training through PyTorch's DDP with gradcodec's communication hook (gloo)
    "ddp": {"configs": ["dense", "topk-1%", "powersgd-2", "adacomp", "fp16"], "seeds": "0,1,2", "scale": 1.0, "models": ["cnn"],
            "ranks": 4, "transport": "ddp"},
}


def mpiexec() -> str:
    exe = Path(sys.executable).parent / "mpiexec"
    return str(exe) if exe.exists() else "mpiexec"


def cmd_run(args) -> int:
    s = SETS[args.set]
    out = Path(args.out) / args.set
    out.mkdir(parents=True, exist_ok=True)
    models = args.models.split(",") if args.models else s["models"]
    configs = args.configs or ",".join(s["configs"])
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for m in models:
        if m == "lstm":
            cfgs = ",".join(c for c in configs.split(",") if not c.startswith("pufferfish"))  # (the LSTM stays dense)
        else:
            cfgs = configs
        steps = max(8, int(STEPS[m] * s["scale"]))
        cmd = [mpiexec(), "-n", str(s["ranks"]), sys.executable, "-m", "mpi4py", str(WORKER), "--model", m, "--steps", str(steps),
               "--seeds", s["seeds"], "--configs", cfgs, "--eval-every", str(max(1, steps // 6)),
               "--out", str(out / (f"{m}-{args.tag}.json" if args.tag else f"{m}.json")),
               "--transport", s.get("transport", "mpi")]
        print("$", " ".join(cmd), flush=True)
        t = time.perf_counter()
        rc = subprocess.call(cmd, env=env, timeout=args.timeout)
        print(f"{m}: exit {rc}, {time.perf_counter() - t:.0f} s", flush=True)
        if rc:
            return rc
    return 0


# ---------------------------------------------------------------------------------- report
def load(path: Path) -> list:
    runs = []
    for f in sorted(path.glob("*.json"), key=lambda f: (f.stem.split("-")[0], "-" in f.stem, f.stem)):  # (a model's tagged runs after its main ones)
        runs += json.loads(f.read_text())
    return runs


def summarize(runs: list) -> dict:
    """``{model: {config: row}}``: the metric's mean and spread (sample std) over seeds, the
    bytes a rank sends a step, per layer type the compression, the time a step."""
    import numpy as np

    out: dict = {}
    for r in runs:
        out.setdefault(r["model"], {}).setdefault(r["config"], []).append(r)
    table = {}
    for m, by in sorted(out.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)):
        table[m] = {}
        for c, rs in by.items():
            vals = np.array([r["metric"] for r in rs])
            kinds = {}
            for k in rs[0]["bytes_by_layer_type"]:
                w = np.mean([r["bytes_by_layer_type"][k]["wire"] for r in rs])
                d = np.mean([r["bytes_by_layer_type"][k]["dense"] for r in rs])
                kinds[k] = d / w if w else float("inf")
            table[m][c] = {
                "spec": rs[0]["spec"], "momentum": rs[0]["momentum"], "dense_first": rs[0].get("dense_first", 0), "seeds": len(rs), "mean": float(vals.mean()),
                "std": float(vals.std(ddof=1)) if len(vals) > 1 else 0.0, "params": rs[0]["params"],
                "bytes": float(np.mean([r["bytes_sent_per_step"] for r in rs])), "dense_bytes": rs[0]["dense_bytes_per_step"],
                "kinds": kinds, "step_ms": float(np.median([r["step_ms"] for r in rs])), "steps": rs[0]["steps"],
                "metric_name": rs[0]["metric_name"],
            }
    return table


def markdown(table: dict) -> str:
    lines = []
    for m, rows in table.items():
        meta = {"metric": next(iter(rows.values()))["metric_name"]}
        base = rows.get("dense")
        lines += [f"**{m}** ({meta['metric']}, {next(iter(rows.values()))['steps']} steps, "
                  f"{next(iter(rows.values()))['seeds']} seed(s))", "",
                  f"| configuration | spec | {meta['metric']} | vs dense | bytes a rank sends a step | x fewer than dense | "
                  "x per layer type (frames) | ms a step |", "|---|---|---|---|---|---|---|---|"]
        for c, r in rows.items():
            delta = "" if base is None or c == "dense" else f"{r['mean'] - base['mean']:+.4f}"
            spec = (r["spec"] + (f", momentum={r['momentum']}" if r["momentum"] else "") + (f", {r['params']:,} params" if base and r["params"] != base["params"] else "")
                    + (f", dense for the first {r['dense_first']} steps" if r["dense_first"] else ""))
            kinds = ", ".join(f"{k} {v:,.0f}x" if v >= 10 else f"{k} {v:.2f}x" for k, v in sorted(r["kinds"].items()))
            lines.append(f"| {c} | `{spec}` | {r['mean']:.4f} ± {r['std']:.4f} | {delta} | {r['bytes']:,.0f} | "
                         f"{(base or r)['bytes'] / r['bytes']:,.1f} | {kinds} | {r['step_ms']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def plots(runs: list, table: dict, img: Path) -> list:
    """The figures: per model, the metric against bytes a step (one point per configuration,
    the seeds' spread as error bars), the loss curves against dense, and the compression per
    layer type.  Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    img.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, path: Path) -> Path:
        """``fig`` into ``path``, saying how it was made (the runs' JSON: 4 ranks, MPI transport)."""
        fig.text(0.01, 0.01, "made by: python scripts/reproduce.py report (4 MPI ranks, gradcodec's Allreducer)", fontsize=6)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    for m, rows in table.items():
        metric = next(iter(rows.values()))["metric_name"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (c, r) in enumerate(rows.items()):
            ax.errorbar(r["bytes"], r["mean"], yerr=r["std"], fmt="o", capsize=3)
            ax.annotate(c, (r["bytes"], r["mean"]), fontsize=6, xytext=(3, 4 + 7 * (i % 3)), textcoords="offset points")  # (staggered: neighbours overlap less)
        ax.set_xscale("log")
        ax.set_xlabel("bytes a rank sends a step (frames, headers included; log)")
        ax.set_ylabel(metric)
        ax.set_title(f"{m}: {metric} against bytes on the wire (mean ± std over seeds)")
        written.append(save(fig, img / f"evidence-{m}-bytes.png"))

        fig, ax = plt.subplots(figsize=(7, 4.5))
        curves: dict = {}
        for r in runs:
            if r["model"] == m:
                curves.setdefault(r["config"], []).append(r["loss"])
        for i, (c, cs) in enumerate(curves.items()):
            steps = [s for s, _ in cs[0]]
            mean = np.mean([[v for _, v in curve] for curve in cs], axis=0)
            ax.plot(steps, mean, label=c, lw=2.2 if c == "dense" else 1.0, color="black" if c == "dense" else None,
                    linestyle=("-", "--", ":")[i // 10 % 3])  # (ten colours a cycle: the line style tells the cycles apart)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (ranks' mean, seeds' mean; log)")
        ax.set_title(f"{m}: training loss against uncompressed (black)")
        ax.legend(fontsize=6, ncol=2)
        written.append(save(fig, img / f"evidence-{m}-loss.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels, bars = [], {}
    for m, rows in table.items():
        for c, r in rows.items():
            if c in ("dense", "pufferfish"):
                continue
            labels.append(f"{m} {c}")
            for k in ("conv", "fc", "recurrent"):
                bars.setdefault(k, []).append(r["kinds"].get(k, np.nan))
    x = np.arange(len(labels))
    for i, (k, v) in enumerate(bars.items()):
        ax.bar(x + (i - 1) * 0.27, v, 0.27, label=k)
    ax.set_yscale("log")
    ax.set_xticks(x, labels, rotation=90, fontsize=6)
    ax.set_ylabel("dense bytes / frame bytes (log)")
    ax.set_title("compression per layer type (per-tensor frame bytes)")
    ax.legend(fontsize=7)
    written.append(save(fig, img / "evidence-layer-types.png"))
    return written


def write_between(path: Path, name: str, text: str) -> None:
    """Replace what stands between ``<!-- BEGIN name ... -->`` and ``<!-- END name -->`` in
    ``path`` (docs/evidence.md) with ``text``."""
    doc = path.read_text()
    begin, end = doc.find(f"<!-- BEGIN {name}"), doc.find(f"<!-- END {name} -->")
    if begin < 0 or end < begin:
        raise SystemExit(f"{path} has no '<!-- BEGIN {name} ... -->' ... '<!-- END {name} -->' markers to write the {name} tables between")
    begin = doc.index("-->", begin) + 3
    path.write_text(doc[:begin] + "\n" + text.strip() + "\n" + doc[end:])


def cmd_report(args) -> int:
    runs = load(Path(args.out) / args.set)
    if not runs:
        print(f"no results in {Path(args.out) / args.set}: run 'scripts/reproduce.py run --set {args.set}' first", file=sys.stderr)
        return 1
    table = summarize(runs)
    if args.json:
        print(json.dumps(table, indent=1))
    elif args.write:
        write_between(Path(args.write), args.set, markdown(table))
        print(f"wrote the {args.set} tables into {args.write}", file=sys.stderr)
    else:
        print(markdown(table))
    if not args.no_plots:
        for f in plots(runs, table, Path(args.img)):
            print(f"wrote {f}", file=sys.stderr)
    return 0


#: models of the cost table: name -> dense float32 gradient bytes
COST_MODELS = {"the CNN here (0.29 MB)": 287_016, "ResNet-18 (45 MB)": 44_695_848, "ResNet-50 (102 MB)": 102_228_128,
               "BERT-base (438 MB)": 438_000_000}
#: a rank's bytes a step as a fraction of the dense bytes, measured on ResNet-18's frames
#: (docs/benchmarks.md, "The DDP hook against PyTorch's hooks": 409,483 and 619,640 of 44,695,848)
COST_FRACTIONS = {"topk": 409_483 / 44_695_848, "powersgd": 619_640 / 44_695_848}


def cmd_costs(args) -> int:
    """docs/choosing.md's table: the communication of one step by the alpha-beta model
    (transport.costmodel), dense against fp16, top-k(1%)+fp16 and PowerSGD rank 4."""
    from transport.costmodel import LINKS, Link, ring_allgather, ring_allreduce

    def ms(s: float) -> str:
        return f"{s * 1e3:.2f}" if s < 0.1 else f"{s * 1e3:.0f}"

    print("| model | link | ranks | dense | fp16 | top-k 1% + fp16 | PowerSGD rank 4 |")
    print("|---|---|---|---|---|---|---|")
    for name, d in COST_MODELS.items():
        for lname, bw, alpha in LINKS:
            link = Link(alpha, bw)
            for p in (8, 64):
                row = (ring_allreduce(p, d, link), ring_allreduce(p, d / 2, link), ring_allgather(p, d * COST_FRACTIONS["topk"], link),
                       ring_allreduce(p, d * COST_FRACTIONS["powersgd"], link))
                print(f"| {name} | {lname} | {p} | " + " | ".join(ms(t) for t in row) + " |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("run", help="train: one MPI job a model")
    sp.add_argument("--set", choices=sorted(SETS), default="reduced")
    sp.add_argument("--models", help="comma-separated subset of cnn, mlp, lstm")
    sp.add_argument("--configs", help="comma-separated configurations (examples/reproduce/worker.py CONFIGS)")
    sp.add_argument("--out", default=str(ROOT / "results"))
    sp.add_argument("--timeout", type=float, default=4 * 3600)
    sp.add_argument("--tag", help="write <model>-TAG.json (configurations added to a set's results)")
    sp.set_defaults(func=cmd_run)
    sp = sub.add_parser("report", help="tables and plots from the results")
    sp.add_argument("--set", choices=sorted(SETS), default="full")
    sp.add_argument("--out", default=str(ROOT / "results"))
    sp.add_argument("--img", default=str(ROOT / "docs" / "img"))
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--write", metavar="DOC", help="write the tables between the set's BEGIN/END markers of DOC (docs/evidence.md)")
    sp.add_argument("--no-plots", action="store_true")
    sp.set_defaults(func=cmd_report)
    sp = sub.add_parser("costs", help="docs/choosing.md's table: one step's communication by the cost model (ms)")
    sp.set_defaults(func=cmd_costs)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
