"""Run folders and their records. Every write is atomic (`kvjax.files`), so an interrupted run
never leaves half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvjax.files import write_json_atomic, write_text_atomic


# ---------------------------------------------------------------------------------------------
# Run folders: runs/<experiment>/<run-id>/ with config.yaml, environment.json, manifest.json and
# one points/<key>.json per finished point. A point is finished when its file exists; files are
# written atomically, so a run killed at any moment resumes without recomputing or half-files.
# ---------------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """What produced a record: versions, backend, device, XLA flags, host, date."""
    import datetime
    import platform
    import sys

    import flax
    import jax

    import kvjax

    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kvjax": kvjax.__version__,
        "jax": jax.__version__,
        "flax": flax.__version__,
        "python": sys.version.split()[0],
        "backend": jax.default_backend(),
        "device": f"{device.platform}:{device.device_kind}",
        "device_count": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "host": platform.node(),
    }


def point_file_name(key: str) -> str:
    """A file name for a point key (`model.num_kv_heads=8,workload.batch=1`), reversible enough
    to read and unique: unsafe characters become '_' and a short hash disambiguates."""
    import hashlib
    import re

    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:120]
    return f"{slug}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.json"


class RunDir:
    """One run of one experiment: its resolved config, environment, manifest and point records."""

    def __init__(self, root: str | Path, experiment: str, run_id: str):
        self.path = Path(root) / experiment / run_id
        self.points_dir = self.path / "points"

    def start(self, config: dict[str, Any], keys: list[str]) -> None:
        import yaml

        self.points_dir.mkdir(parents=True, exist_ok=True)
        config_text = yaml.safe_dump(config, sort_keys=False)
        old = self.path / "config.yaml"
        if old.exists() and old.read_text() != config_text:
            raise ValueError(
                f"{self.path} holds a run of a different config; choose another --run-id"
            )
        write_text_atomic(old, config_text)
        env = self.path / "environment.json"
        if env.exists():  # a resumed run keeps its first environment and records each resume
            write_json_atomic(
                self.path
                / f"environment-resumed-{len(list(self.path.glob('environment-resumed-*')))}.json",
                environment(),
            )
        else:
            write_json_atomic(env, environment())
        self.write_manifest(keys)

    def write_manifest(self, keys: list[str]) -> None:
        write_json_atomic(
            self.path / "manifest.json",
            {
                "points": [
                    {"key": k, "file": f"points/{point_file_name(k)}", "done": self.done(k)}
                    for k in keys
                ]
            },
        )

    def artifacts_dir(self, key: str) -> Path:
        """A folder for files a point keeps beside its record (traces), named like its record."""
        return self.path / "artifacts" / point_file_name(key).removesuffix(".json")

    def done(self, key: str) -> bool:
        return (self.points_dir / point_file_name(key)).exists()

    def write_point(self, key: str, records: list[dict[str, Any]]) -> None:
        write_json_atomic(self.points_dir / point_file_name(key), {"key": key, "records": records})

    def records(self) -> list[dict[str, Any]]:
        out = []
        for f in sorted(self.points_dir.glob("*.json")):
            data = json.loads(f.read_text())
            for r in data["records"]:
                out.append({"point": data["key"], **r})
        return out


def load_records(runs, experiment: str | None = None):
    """Every record under a runs folder, or several (a GPU run's folder beside a CPU run's), or
    one experiment's, as a pandas DataFrame."""
    import pandas as pd
    import yaml

    roots = [Path(r) for r in ([runs] if isinstance(runs, str | Path) else runs)]
    rows = []
    for f in sorted(f for root in roots for f in root.glob("*/*/points/*.json")):
        data = json.loads(f.read_text())
        run_dir = f.parent.parent
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        exp = config.get("experiment", run_dir.parent.name)
        if experiment and exp != experiment:
            continue
        for r in data["records"]:
            rows.append(
                {
                    "experiment": exp,
                    "run_name": run_dir.parent.name,
                    "run_id": run_dir.name,
                    "point": data["key"],
                    **r,
                }
            )
    return pd.DataFrame(rows)
