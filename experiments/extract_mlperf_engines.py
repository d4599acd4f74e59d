"""Each MLPerf TensorRT-LLM row's engine settings, read from its submission's own configuration
file (the `config:` its quote in experiments/published/systems.csv names), into
experiments/published/mlperf_engines.csv for `kvjax.serving.system_predict`:

    python3 -m experiments.extract_mlperf_engines --v5.1 GIT_DIR [--v4.1 GIT_DIR]

GIT_DIR: a clone of github.com/mlcommons/inference_results_v5.1 (or v4.1), read at its HEAD,
whose commit each row cites. v5.1's files hold one block a workload: from the block of the row's
accuracy target (0.99, or 0.999 for a `-99.9` benchmark) at MaxP, `gpu_batch_size` (the engine's
max batch), the runtime `max_num_tokens` (tokens a step), `batch_scheduler_policy`,
`kvcache_free_gpu_mem_frac` and `enable_chunked_context`. v4.1's (NVIDIA's) are Python classes,
one a system, each inheriting its settings: the class registered for the row's system (Custom
harness, the row's accuracy target, MaxP) is resolved through its bases and the benchmark's
GPUBaseConfig, and the scheduler policy is the harness's default (`trtllm_batch_sched_policy`,
max_util, code/harness/harness_llm/main_llm.cc; no config sets it). A row whose file has no such
block or class, or states no batch or token budget, is left out (its prediction keeps
trtllm-bench's defaults, said per row), unless the CSV already holds it: 68 rows were read with
a helper script from files this parser does not read (Cisco's multi-node runs set by
`closed/Cisco/environment_var_resolver.sh`; v4.1 partners' classes registered under a system id
their `code/common/systems` lists map), each quoting its file and lines, and are kept."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pandas as pd

from experiments.mlperf_repos import parse_repos
from kvjax.files import write_text_atomic
from kvjax.serving.systems import read_systems

OUT = Path("experiments/published/mlperf_engines.csv")
HARNESS = "code/harness/harness_llm/main_llm.cc"  # v4.1: the scheduler policy's default
NVIDIA = "nvidia"  # the source group of NVIDIA's own submissions (the others: mlperf-<submitter>)


def block(text: str, accuracy: str) -> str | None:
    """The settings of one accuracy target at MaxP (to the next WorkloadSetting); where the
    target maps to a dict defined by name (deepseek-r1's `EXPORTS = {...: base}`), that dict."""
    head = re.search(rf"C\.AccuracyTarget\({re.escape(accuracy)}\), C\.PowerSetting\.MaxP\)", text)
    if head is None:
        return None
    end = text.find("C.WorkloadSetting(", head.end())
    part = text[head.end() : end if end >= 0 else len(text)]
    named = re.match(r"\s*:\s*(\w+)\s*,?\s*\}?\s*$", part)
    if named:
        found = re.search(rf"^{named.group(1)} = \{{(.*?)^\}}", text, re.S | re.M)
        return found.group(1) if found else None
    return part


def settings(text: str) -> dict | None:
    """The engine settings a config block states (None: no batch or token budget)."""
    batch = re.search(r"gpu_batch_size: \{\s*'[^']+': (\d+)", text)
    runtime = re.search(r"trtllm_runtime_flags: \{(.*?)\}", text, re.S)
    scope = runtime.group(1) if runtime else text
    tokens = re.search(r"'max_num_tokens': (\d+)", scope)
    if not (batch and tokens):
        return None
    policy = re.search(r"'batch_scheduler_policy': '(\w+)'", scope)
    frac = re.search(r"'kvcache_free_gpu_mem_frac': ([\d.]+)", scope)
    chunked = re.search(r"'enable_chunked_context': (True|False)", scope)
    return {
        "max_batch": int(batch.group(1)),
        "max_num_tokens": int(tokens.group(1)),
        "batch_scheduler_policy": policy.group(1) if policy else "",
        "kvcache_free_gpu_mem_frac": float(frac.group(1)) if frac else None,
        "enable_chunked_context": chunked.group(1) if chunked else "",
        "quote": " | ".join(
            " ".join(m.group(0).split()) for m in (batch, tokens, policy, frac, chunked) if m
        ),
    }


def _classes(source: str) -> dict[str, dict]:
    """A v4.1 configuration module's classes: bases, registration and literal settings."""
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        attrs = {}
        for st in node.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1:
                name = getattr(st.targets[0], "id", None)
                try:
                    attrs[name] = ast.literal_eval(st.value)
                except ValueError:
                    attrs[name] = ast.unparse(st.value)  # KnownSystem.X, expressions
        out[node.name] = {"bases": [ast.unparse(b) for b in node.bases], "attrs": attrs,
                          "registered": [ast.unparse(d) for d in node.decorator_list]}  # fmt: skip
    return out


def _resolve(classes: dict[str, dict], name: str) -> dict[str, tuple]:
    """A class's settings through its bases: each (value, the class that states it)."""
    if name not in classes:
        return {}
    got = {}
    for base in classes[name]["bases"]:
        got.update(_resolve(classes, base))
    got.update({k: (v, name) for k, v in classes[name]["attrs"].items()})
    return got


def settings_v41(module: str, parent: str, system: str, accuracy: str) -> dict | None:
    """A v4.1 row's settings: the class registered for its system (Custom harness, its accuracy
    target, MaxP), resolved through its bases and the benchmark's GPUBaseConfig (`parent`)."""
    classes = {**_classes(parent), **_classes(module)}
    want = "".join(c if c.isalnum() else "_" for c in system)
    found = []
    for name, c in _classes(module).items():
        reg = " ".join(c["registered"])
        if "HarnessType.Custom" not in reg or "PowerSetting.MaxP" not in reg:
            continue
        if not re.search(rf"AccuracyTarget\.{accuracy}\b", reg):  # k_99, not k_99_9
            continue
        got = _resolve(classes, name)
        known = str(got.get("system", ("",))[0]).removeprefix("KnownSystem.")
        if known and want.endswith(known):
            found.append((len(known), name, got))
    if not found:
        return None
    _, name, got = max(found)
    if "gpu_batch_size" not in got or "max_num_tokens" not in got:
        return None
    batch, tokens = got["gpu_batch_size"], got["max_num_tokens"]
    frac = got.get("kvcache_free_gpu_mem_frac")
    said = [f"class {name}: gpu_batch_size = {batch[0]} ({batch[1]})",
            f"max_num_tokens = {tokens[0]} ({tokens[1]})"]  # fmt: skip
    if frac:
        said.append(f"kvcache_free_gpu_mem_frac = {frac[0]} ({frac[1]})")
    said.append(f"trtllm_batch_sched_policy default 'max_util' ({HARNESS})")
    return {
        "max_batch": int(next(iter(batch[0].values()))),
        "max_num_tokens": int(tokens[0]),
        "batch_scheduler_policy": "max_util",
        "kvcache_free_gpu_mem_frac": float(frac[0]) if frac else None,
        "enable_chunked_context": "",
        "quote": " | ".join(said),
    }


def main() -> None:
    repos = parse_repos(__doc__)
    out, seen = [], set()
    for r in read_systems():
        found = re.search(r"config: (\S+\.py)", r["quote"] or "")
        version = repos.version_of(r["file"])
        # NVIDIA's own v5.1 files are read as its partners' are (its v4.1 classes were read by
        # hand, with the precision and placement they set, and are kept)
        own = r["source_group"] == NVIDIA and version == "5.1"
        if not (
            (r["source_group"].startswith("mlperf-") or own) and "_TRT" in r["source"] and found
        ):
            continue
        if r["source"] in seen or version is None:
            continue
        seen.add(r["source"])
        path, benchmark = found.group(1), r["source"].split(":")[3]
        text = repos.show(version, path)
        if text is None:
            continue
        if version == "5.1":
            part = block(text, "0.999" if benchmark.endswith("-99.9") else "0.99")
            got = settings(part) if part else None
        else:
            parent = repos.show(version, str(Path(path).parents[1] / "__init__.py")) or ""
            system = r["source"].split(":")[2].removesuffix("_TRT")
            accuracy = "k_99_9" if benchmark.endswith("-99.9") else "k_99"
            try:
                got = settings_v41(text, parent, system, accuracy)
            except SyntaxError:  # Sustainable_Metal_Cloud's Server custom.py, as published
                got = None
        if got:
            out.append({"source": r["source"], **got, "file": repos.cite(version, path)})
    # rows read by hand from files this parser does not read (Cisco's multi-node resolver
    # script, v4.1 classes registered under another system id) are kept as they are
    made = {o["source"] for o in out}
    kept = []
    if OUT.exists():
        kept = [
            r
            for r in pd.read_csv(OUT, keep_default_na=False).to_dict("records")
            if r["source"] not in made
        ]
    write_text_atomic(OUT, pd.DataFrame(out + kept).to_csv(index=False))
    print(f"{len(out)} rows' engine settings written to {OUT}, {len(kept)} kept as read by hand")


if __name__ == "__main__":
    main()
