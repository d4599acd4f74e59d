"""MLCommons' inference results repositories as the MLPerf extractors read them
(`experiments/extract_mlperf_engines.py`, `experiments/extract_amd_engines.py`): the
`--v5.1`/`--v4.1` git directories, each read at its HEAD, whose commit the rows cite."""

from __future__ import annotations

import argparse
import subprocess

REPO = "github.com/mlcommons/inference_results_v{}"


class ResultsRepos:
    """The results repositories given, by version ("5.1", "4.1"): their HEAD commits, the
    version a row's `file` cites, and a file's text at HEAD."""

    def __init__(self, dirs: dict[str, str]):
        self.dirs = dirs
        self.commits = {v: self._git(v, "rev-parse", "HEAD").stdout.strip() for v in dirs}

    def _git(self, version: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "-C", self.dirs[version], *args], capture_output=True, text=True
        )

    def version_of(self, file: str) -> str | None:
        """The version whose repository a row's `file` names (None: none given)."""
        return next((v for v in self.dirs if REPO.format(v) in file), None)

    def show(self, version: str, path: str) -> str | None:
        """The file's text at HEAD (None: not in the repository)."""
        shown = self._git(version, "show", f"HEAD:{path}")
        return shown.stdout if shown.returncode == 0 else None

    def cite(self, version: str, path: str) -> str:
        return f"{REPO.format(version)} @ {self.commits[version]} : {path}"


def parse_repos(doc: str) -> ResultsRepos:
    """`--v5.1 GIT_DIR` and/or `--v4.1 GIT_DIR`, refused by name without either."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for version in ("5.1", "4.1"):
        p.add_argument(
            f"--v{version}",
            dest=f"v{version.replace('.', '')}",
            help=f"the git directory of an inference_results_v{version} clone",
        )
    a = p.parse_args()
    dirs = {v: d for v, d in (("5.1", a.v51), ("4.1", a.v41)) if d}
    if not dirs:
        p.error("give --v5.1 GIT_DIR, --v4.1 GIT_DIR or both")
    return ResultsRepos(dirs)
