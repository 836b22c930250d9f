"""``python -m torchquant demo``: the first thing a new user runs."""
from __future__ import annotations

import argparse
import sys

from .demo import run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchquant")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="quantize the bundled example and print measured results")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo()
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
