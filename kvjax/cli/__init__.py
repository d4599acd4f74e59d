"""The `kvjax` command line: `main` parses and dispatches (`kvjax.cli.main`); each subcommand's
parser, runner and report builder live in their own module (`calc`, `trace`, `bench`, `runs`);
`render` draws the reports as tables; `args` holds the options they share."""

from kvjax.cli.main import main

__all__ = ["main"]
