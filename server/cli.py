"""`gguf-serve`: the command line. `inspect` shows what a GGUF file holds."""

from __future__ import annotations

import argparse
import json
import sys

from ..gguf_io import GGUFError, GGUFReader, describe
from ..gguf_io.summary import format_description
from .default_model import default_model_path


def _inspect(args: argparse.Namespace) -> int:
    path = args.file or default_model_path()
    try:
        reader = GGUFReader(path)
    except (GGUFError, OSError) as e:
        print(f"gguf-serve inspect: {e}", file=sys.stderr)
        return 1
    d = describe(reader)
    if args.json:
        if args.no_tensors:
            d.pop("tensors")
        json.dump(d, sys.stdout, indent=2)
        print()
    else:
        print(format_description(d, tensors=not args.no_tensors))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguf-serve", description="Serve GGUF models over the OpenAI API.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="show what a GGUF file holds (architecture, size, quant mix, tensors)")
    p.add_argument("file", nargs="?", help="a .gguf file (the first shard of a split model); default: the embedded Gemma 3 270M")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-tensors", action="store_true", help="leave out the tensor table")
    p.set_defaults(func=_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
