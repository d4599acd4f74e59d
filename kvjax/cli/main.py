"""The `kvjax` command: one parser builder per subcommand (in `kvjax.cli.<name>`), and the error
boundary that turns bad input into one line and exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from kvjax.cli import bench, calc, profile, runs, trace
from kvjax.errors import KvjaxError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvjax",
        description="Why transformer decoding is slow: closed forms, traces and measurements.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    calc.add_parser(sub)
    trace.add_parser(sub)
    bench.add_parsers(sub)
    profile.add_parser(sub)
    runs.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:  # `kvjax ... | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 0
    except KvjaxError as exc:
        print(f"kvjax {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
