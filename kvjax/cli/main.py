"""The `kvjax` command: one parser builder per subcommand (in `kvjax.cli.<name>`), and the error
boundary that turns bad input into one line and exit 2.

Telling input errors from programming errors: everything kvjax validates raises `KvjaxError`
(a field, a file, a flag, with what is allowed); the environment refusing a file (no such file,
read-only folder, full disk) is an `OSError`, which names its path. Both are the user's to fix
and print one line. Anything else is a bug in kvjax and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from kvjax.cli import bench, calc, frontier, plan, profile, runs, serve, simulate, trace, validate
from kvjax.errors import KvjaxError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvjax",
        description="Why transformer decoding is slow: closed forms, traces and measurements.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    calc.add_parser(sub)
    frontier.add_parser(sub)
    trace.add_parser(sub)
    bench.add_parsers(sub)
    profile.add_parser(sub)
    runs.add_parsers(sub)
    validate.add_parser(sub)
    simulate.add_parser(sub)
    plan.add_parser(sub)
    serve.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # `kvjax run --processes N` starts N copies of it
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:  # `kvjax ... | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 0
    except KvjaxError as exc:
        print(f"kvjax {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system said no: name the path and why
        where = f" {exc.filename!r}" if exc.filename else ""
        print(
            f"kvjax {args.command}: error: cannot use{where}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
