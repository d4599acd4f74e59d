"""The `kvjax` command line, a module per subcommand beside the rendering and shared options:

- `main`: the parser of every subcommand, and the error boundary (bad input: one line, exit 2)
- `args`: the options the subcommands share (model, workload, chip) and `--json` output
- `load_args`: the load and engine options of `simulate` and `serve`
- `calc`: `kvjax calc`, its options and the run that assembles its report
- `calc_report`: calc's closed-form reports (the step, a placement, the attention both ways)
- `frontier`: `kvjax frontier`, the throughput-latency frontier per attention variant
- `trace`: `kvjax trace`, XLA's cost analysis beside the closed form, sharded or for a target
- `bench`: `kvjax ceilings` and `kvjax bench`, kernels timed on this device's roofline
- `profile`: `kvjax profile`, the served step timed in situ, op by op
- `validate`: `kvjax validate`, published measurements against the bounds and predictions
- `simulate`: `kvjax simulate`, requests under load on a chip's modelled step times
- `serve`: `kvjax serve`, the same load served by kvjax's engine on this machine
- `runs`: `kvjax run`, `kvjax figures` and `kvjax explore`
- `render_common`: what the renderers share (the console, the attention label, ratios)
- `render`: trace and bench reports as tables, and the spinner
- `render_calc`: calc's report as lines and tables
- `render_parallel`: placements, pipelines and the sharded trace as tables
- `render_target`: a target's executable, per kernel, as tables
"""

from kvjax.cli.main import main

__all__ = ["main"]
