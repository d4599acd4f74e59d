"""Run folders and their records. Every write is atomic (`kvjax.files`), so an interrupted run
never leaves half a file."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvjax.errors import KvjaxError
from kvjax.files import write_json_atomic, write_text_atomic


# ---------------------------------------------------------------------------------------------
# Run folders: runs/<experiment>/<run-id>/ with config.yaml, environment.json, manifest.json and
# one points/<key>.json per finished point. A point is finished when its file exists; files are
# written atomically, so a run killed at any moment resumes without recomputing or half-files.
# ---------------------------------------------------------------------------------------------
def environment(hosts: list[str] | None = None) -> dict[str, Any]:
    """What produced a record: versions, backend, device, XLA flags, host, date, and the
    processes that ran it (`hosts`: every process's host name, in process order)."""
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
        "cpu": cpu_description(),
        "process_count": len(hosts) if hosts else 1,
        "hosts": hosts or [platform.node()],
        "code": code_fingerprint(),
    }


CODE_GLOBS = ("kvjax/**/*.py", "experiments/**/*.py", "experiments/published/*.csv")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """What computed a record, as one hash: the kvjax package's and the experiments' sources and
    the published corpus (`CODE_GLOBS`, each file's path and bytes), so a run resumed after the
    code changed can say that its finished points came from other code (`RunDir.stale_points`),
    with or without git."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha1()
    for path in sorted({f for g in CODE_GLOBS for f in root.glob(g) if f.is_file()}):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cpu_description() -> str:
    """The host CPU as a figure names it: `AMD EPYC 7B13 (2 cores)` (Linux's /proc/cpuinfo model
    name, else platform.processor()), the cores being those this process may use."""
    import platform

    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    name = " ".join((name or platform.processor() or "CPU").split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name} ({cores} cores)"


def point_file_name(key: str) -> str:
    """A file name for a point key (`model.num_kv_heads=8,workload.batch=1`), reversible enough
    to read and unique: unsafe characters become '_' and a short hash disambiguates."""
    import hashlib
    import re

    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:120]
    return f"{slug}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.json"


PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_plain_name(what: str, name: str) -> str:
    """A run id or experiment name becomes a folder: letters, digits, '.', '_', '-', never a
    path (`../../x` would write outside the runs folder)."""
    if not isinstance(name, str) or not PLAIN_NAME.match(name):
        raise KvjaxError(
            f"{what}={name!r} must be a plain name: letters, digits, '.', '_' or '-', starting "
            "with a letter or digit, at most 100 characters"
        )
    return name


def read_point(path: Path) -> dict[str, Any] | None:
    """A point file's content, or None when it does not parse as a point (a crash of another
    tool, a full disk): such a file never counts as a finished point."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("key"), str)
    ok = ok and isinstance(data.get("records"), list)
    return data if ok and all(isinstance(r, dict) for r in data["records"]) else None


def _warn(message: str) -> None:
    import sys

    print(f"kvjax: warning: {message}", file=sys.stderr)


class RunDir:
    """One run of one experiment: its resolved config, environment, manifest and point records."""

    def __init__(self, root: str | Path, experiment: str, run_id: str):
        self.path = (
            Path(root)
            / check_plain_name("experiment", experiment)
            / check_plain_name("run id", run_id)
        )
        self.points_dir = self.path / "points"

    def stale_points(self, keys: list[str]) -> str | None:
        """A warning when finished points of these keys were computed by other code than this
        (the environments the run recorded, its first and each resume's, name another
        `code_fingerprint`, or none): resuming keeps them as they are, so a figure drawn from the
        folder mixes the two. None when every recorded environment is this code's."""
        done = sum(self.done(k) for k in keys)
        if not done:
            return None
        envs = [self.path / "environment.json", *sorted(self.path.glob("environment-resumed-*"))]
        codes = set()
        for env in envs:
            try:
                codes.add(json.loads(env.read_text()).get("code"))
            except (OSError, ValueError):
                codes.add(None)
        now = code_fingerprint()
        if codes <= {now}:
            return None
        other = ", ".join(sorted(c or "none recorded" for c in codes - {now}))
        return (
            f"{self.path}: {done} of its {len(keys)} points were computed by other code (code "
            f"{other}; this is {now}) and are kept as they are, not recomputed; for results of "
            "this code use a fresh --runs folder or another --run-id"
        )

    def check_config(self, config: dict[str, Any]) -> str:
        """The config's text; refused if the folder holds a run of another config."""
        import yaml

        config_text = yaml.safe_dump(config, sort_keys=False)
        old = self.path / "config.yaml"
        if old.exists() and old.read_text() != config_text:
            raise KvjaxError(
                f"{self.path} holds a run of a different config; choose another --run-id"
            )
        return config_text

    def start(self, config: dict[str, Any], keys: list[str], hosts=None) -> None:
        """Before computing points: the config (checked), the environment (a resumed run keeps
        its first and records each resume) and the manifest. A finished run writes nothing, so it
        can be resumed as a no-op from a read-only folder."""
        config_text = self.check_config(config)
        self.points_dir.mkdir(parents=True, exist_ok=True)
        if not (self.path / "config.yaml").exists():
            write_text_atomic(self.path / "config.yaml", config_text)
        env = self.path / "environment.json"
        if env.exists():
            resumed = len(list(self.path.glob("environment-resumed-*")))
            write_json_atomic(self.path / f"environment-resumed-{resumed}.json", environment(hosts))
        else:
            write_json_atomic(env, environment(hosts))
        self.write_manifest(keys)

    @contextmanager
    def lock(self):
        """Held while this process writes the run: a second `kvjax run` of the same folder is
        refused with the holder's pid (a lock left by a process that died is taken over)."""
        self.path.mkdir(parents=True, exist_ok=True)
        lock = self.path / ".lock"
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                pid = _lock_holder(lock)
                if pid is not None and _alive(pid):
                    raise KvjaxError(
                        f"{self.path} is being written by another kvjax run (pid {pid}); wait "
                        f"for it to finish, or remove {lock} if that process is gone"
                    ) from None
                lock.unlink(missing_ok=True)  # its holder died: take it over
        else:
            raise KvjaxError(f"cannot lock {self.path}: {lock} keeps reappearing")
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        try:
            yield self
        finally:
            lock.unlink(missing_ok=True)

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
        """Finished: its record file exists and parses as this point's."""
        path = self.points_dir / point_file_name(key)
        if not path.exists():
            return False
        data = read_point(path)
        return data is not None and data["key"] == key

    def set_aside_corrupt(self, key: str) -> None:
        """A point file that does not parse is renamed (kept for inspection) and recomputed."""
        path = self.points_dir / point_file_name(key)
        if path.exists() and not self.done(key):
            kept = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            path.rename(kept)
            _warn(f"{path} did not parse as a point: set aside as {kept.name}, recomputing")

    def write_point(self, key: str, records: list[dict[str, Any]], writer=None) -> None:
        """`writer`: which process wrote it ({"process", "process_count", "host"}), beside the
        records (which stay equal to a single process's)."""
        data = {"key": key, "records": records, **({"writer": writer} if writer else {})}
        write_json_atomic(self.points_dir / point_file_name(key), data)

    def records(self) -> list[dict[str, Any]]:
        out = []
        for f in sorted(self.points_dir.glob("*.json")):
            data = read_point(f)
            if data is None:
                _warn(f"{f} does not parse as a point: skipped")
                continue
            for r in data["records"]:
                out.append({"point": data["key"], **r})
        return out


def _lock_holder(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_records(runs, experiment: str | None = None):
    """Every record under a runs folder, or several (a GPU run's folder beside a CPU run's), or
    one experiment's, as a pandas DataFrame. A folder may also be one run's own (the one holding
    its `points/`): `kvjax figures --runs runs/hkv_quality/3fdc894f82 ...` draws exactly those."""
    import pandas as pd
    import yaml

    roots = [Path(r) for r in ([runs] if isinstance(runs, str | Path) else runs)]
    rows, cpus = [], {}
    files = (
        root.glob("points/*.json" if (root / "points").is_dir() else "*/*/points/*.json")
        for root in roots
    )
    for f in sorted({f for found in files for f in found}):
        data = read_point(f)
        if data is None:
            _warn(f"{f} does not parse as a point: skipped")
            continue
        run_dir = f.parent.parent
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        exp = config.get("experiment", run_dir.parent.name)
        if experiment and exp != experiment:
            continue
        if run_dir not in cpus:  # the host CPU from the run's environment, for the figures
            env = run_dir / "environment.json"
            cpus[run_dir] = json.loads(env.read_text()).get("cpu") if env.exists() else None
        for r in data["records"]:
            rows.append(
                {
                    "experiment": exp,
                    "run_name": run_dir.parent.name,
                    "run_id": run_dir.name,
                    "point": data["key"],
                    **({"host_cpu": cpus[run_dir]} if cpus[run_dir] else {}),
                    **r,
                }
            )
    return pd.DataFrame(rows)
