"""``python -m torchquant`` (also the ``torchquant`` command): ``demo`` runs the bundled example;
``quantize`` / ``report`` quantize a saved exported program and compare it with its float
original layer by layer (:mod:`torchquant._cli`)."""
from __future__ import annotations

import argparse
import sys

from ._cli import UserError, add_subcommands
from .demo import run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchquant", description="Quantize PyTorch models on plain integer tensors.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="quantize the bundled example and print measured results")
    add_subcommands(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo()
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.handler(args)
    except UserError as e:
        print(f"torchquant {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"torchquant {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
