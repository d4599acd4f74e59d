"""Standalone benchmark scripts (`python3 -m experiments.benchmarks.<name>`), results in
experiments/results/. The launcher's experiments (modules with `run_point`) are one level up."""
