"""The argument parser of ``gradcodec``: one line, exit status 2, for any bad argument."""

from __future__ import annotations

import argparse

from codec.cli import commands, demo
from codec.cli.errors import PROG, UsageError


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


def positive_int(text: str) -> int:
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
    sp.set_defaults(func=commands.cmd_list)

    sp = sub.add_parser(
        "encode", help="encode a tensor file into a frame (one tensor) or a container (several)",
        description="Encode every tensor of INPUT with SPEC.  One tensor gives a single frame, several a container of named frames; "
                    "--many writes the whole file as one many-tensor frame (format v2).",
    )
    sp.add_argument("spec", metavar="SPEC", help="codec spec, e.g. 'fp16+zstd' or 'threshold(value=0.001)+fp16+zstd'")
    sp.add_argument("input", metavar="INPUT", help="tensor file: .npy, .npz or .safetensors")
    sp.add_argument("-o", "--output", metavar="OUT", required=True, help="output file (any name; .gcf/.gcc by convention)")
    how = sp.add_mutually_exclusive_group()
    how.add_argument("--container", action="store_true", help="write a container even for a single tensor (keeps its name)")
    how.add_argument("--many", action="store_true",
                     help="write one many-tensor frame (format v2, as Codec.encode_many: one header for the whole file, names kept)")
    sp.set_defaults(func=commands.cmd_encode)

    sp = sub.add_parser(
        "decode", help="decode a frame or container into .npy/.npz/.safetensors",
        description="Decode a frame (to .npy, .npz or .safetensors) or a container (to .npz or .safetensors, names kept).",
    )
    sp.add_argument("input", metavar="FRAMEFILE", help="a frame or container written by 'gradcodec encode'")
    sp.add_argument("-o", "--output", metavar="OUT", required=True, help="output tensor file: .npy, .npz or .safetensors")
    sp.set_defaults(func=commands.cmd_decode)

    sp = sub.add_parser("info", help="show the header of a frame or container", description="Show a frame's header (or one row per tensor of a container); nothing is decoded.")
    sp.add_argument("input", metavar="FRAMEFILE")
    sp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sp.set_defaults(func=commands.cmd_info)

    sp = sub.add_parser(
        "roundtrip", help="encode+decode every tensor of a file: ratio, error, speed",
        description="Encode and decode every tensor of INPUT with SPEC and report size, ratio, error and speed per tensor and in total.",
    )
    sp.add_argument("spec", metavar="SPEC")
    sp.add_argument("input", metavar="INPUT", help="tensor file: .npy, .npz or .safetensors")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--repeat", type=positive_int, default=3, metavar="N", help="timed rounds over all tensors, best time per tensor kept (default 3)")
    sp.add_argument("--steps", type=positive_int, metavar="N",
                    help="also code N consecutive steps (a file of stepNNNN/NAME tensors: its steps in order; else the file N times) "
                         "and report how the sum of the decoded steps tracks the true sum, with error feedback and without")
    sp.set_defaults(func=commands.cmd_roundtrip)

    sp = sub.add_parser(
        "demo", help="run codecs on the bundled sample of real gradients",
        description="Run every registered codec (default parameters) and a few pipelines on the bundled gradient sample; one total row per codec.",
    )
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--codecs", metavar="SPEC,SPEC...", help="comma-separated specs to run instead of the default set")
    sp.add_argument("--repeat", type=positive_int, default=3, metavar="N", help="timed rounds over all tensors, best time per tensor kept (default 3)")
    sp.set_defaults(func=demo.cmd_demo)
    return p
