"""The house rules of the tree (DESIGN.md): one package per view with imports pointing down, the
closed form free of jax, plotting free of compute, short modules, and one kernel registry whose
names every view uses."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvjax import analytic, get_model_config, kernels
from kvjax.analytic import Workload

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvjax"
# The top of kvjax: what a chip is, the kernel registry and the helpers (issue 39: at most 10
# modules, __init__ and __main__ included); what a model is lives in kvjax.model.
ROOT_MODULES = {"hardware", "errors", "units", "files", "devices", "kernels", "stats", "dtypes"}
# What each part of kvjax may import from kvjax (itself included): the model under everything,
# analytic <- traced <- measured, nn beside the closed form, runs and cli on top, plotting from
# records (and the presets, for the explorer).
ALLOWED = {
    "root": set(),
    "api": {"model"},
    "model": {"model"},
    "analytic": {"model", "analytic"},
    "nn": {"model", "nn"},
    "traced": {"model", "analytic", "nn", "traced"},
    # the engine is the measured clock of the serving scheduler
    "measured": {"model", "analytic", "nn", "traced", "measured", "serving"},
    "quality": {"model", "analytic", "nn", "quality"},
    "runs": {"model", "analytic", "runs"},
    "predict": {"model", "analytic", "predict"},  # fits and predictions over the closed form
    "serving": {"model", "analytic", "predict", "serving"},  # the scheduler and its clocks
    "plotting": {"model", "plotting"},
    "cli": {
        "model",
        "analytic",
        "nn",
        "traced",
        "measured",
        "runs",
        "plotting",
        "quality",
        "predict",
        "serving",
        "cli",
    },  # fmt: skip
}


# Parts of the top kept as packages of their own modules (a chip's spec apart from the table)
ROOT_PACKAGES = {"hardware"}


def test_the_top_of_kvjax_is_short():
    """kvjax/ reads from its top: a model (kvjax.model), a chip, the kernel registry, the views."""
    top = sorted([p.stem for p in PACKAGE.glob("*.py")] + sorted(ROOT_PACKAGES))
    assert len(top) <= 10, top
    assert set(top) == ROOT_MODULES | {"__init__", "__main__"}
    assert all((PACKAGE / name / "__init__.py").exists() for name in ROOT_PACKAGES)


COMPUTE = ("jax", "jaxlib", "flax", "optax", "chex", "orbax")


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    if rel == ("__main__.py",):
        return "cli"  # `python3 -m kvjax`: the command line's entry point
    if rel == ("__init__.py",):
        return "api"  # `from kvjax import ModelConfig`: the package's face
    return "root" if len(rel) == 1 or rel[0] in ROOT_PACKAGES else rel[0]


def _imports(path: Path) -> list[str]:
    """Every module imported anywhere in the file (top level and inside functions)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            if node.module == "kvjax":  # `from kvjax import analytic`: a submodule import
                names += [f"kvjax.{a.name}" for a in node.names]
    return names


def _kvjax_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "kvjax" or len(parts) == 1:
        return None
    return "root" if parts[1] in ROOT_MODULES or parts[1] == "__version__" else parts[1]


def test_imports_point_down():
    wrong = []
    for path in _modules():
        part = _part(path)
        if part not in ALLOWED:
            raise AssertionError(f"{path}: package {part!r} has no place in the layering")
        for module in _imports(path):
            target = _kvjax_part(module)
            if target in (None, "root") or target in ALLOWED[part]:
                continue
            if module in ("kvjax.ModelConfig", "kvjax.KvjaxError", "kvjax.get_model_config"):
                continue
            wrong.append(f"{path.relative_to(ROOT)} ({part}) imports {module}")
    assert not wrong, "\n".join(wrong)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """kvjax module -> the kvjax modules it imports, anywhere in the file (inside functions and
    TYPE_CHECKING blocks too): `from kvjax.a import b` names the module kvjax.a.b when that is
    a module, else kvjax.a (a name its package defines)."""
    modules = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names
                        if f"{node.module}.{a.name}" in modules]  # fmt: skip
                targets = subs + ([node.module] if len(subs) < len(node.names) else [])
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def test_imports_are_acyclic():
    """No module reaches back up to one that imports it, directly or through others (a lazy
    import inside a function counts: it is the same tie)."""
    graph = _import_graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt) :] + [node, nxt]))
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "\n".join(cycles)


def test_the_cycle_test_finds_a_cycle(tmp_path, monkeypatch):
    """The acyclic test is not vacuous: a package whose two modules import each other fails."""
    pkg = tmp_path / "kvjax"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def f():\n    from kvjax.a import y\n")
    (pkg / "a" / "y.py").write_text("from kvjax.a.x import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    with pytest.raises(
        AssertionError,
        match="kvjax.a.x -> kvjax.a.y -> kvjax.a.x|kvjax.a.y -> kvjax.a.x -> kvjax.a.y",
    ):
        test_imports_are_acyclic()


@pytest.mark.parametrize("part", ["root", "analytic", "predict", "serving", "plotting"])
def test_closed_form_and_plotting_import_no_compute_package(part):
    for path in _modules():
        if _part(path) != part:
            continue
        heavy = [m for m in _imports(path) if m.split(".")[0] in COMPUTE]
        assert not heavy, f"{path.relative_to(ROOT)} imports {heavy}"


def test_closed_form_runs_without_jax():
    code = (
        "import sys, kvjax.analytic.parallel, kvjax.analytic.variants, kvjax.kernels;"
        "bad = [m for m in ('jax', 'flax') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_modules_are_short():
    long = {p: len(p.read_text().splitlines()) for p in _modules()}
    over = {str(p.relative_to(ROOT)): n for p, n in long.items() if n > 400}
    assert not over, over
    assert long[PACKAGE / "cli" / "main.py"] < 250


def test_functions_are_short():
    """No function in kvjax/ over 80 lines as the formatter writes it (its `def` to its last
    line): a long one is split into named steps."""
    over = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    over.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not over, over


# The modules whose `# fmt: skip` markers sit on aligned tables (the kernel registry's rows, the
# GPU targets' columns): a marker anywhere else keeps the formatter from a layout it would
# change, a squeeze.
TABLE_MODULES = {"kvjax/kernels.py", "kvjax/traced/targets.py"}


def test_no_squeezing():
    """`# fmt: skip` only on aligned tables (`TABLE_MODULES`), 60 at most in kvjax/; no issue
    number in kvjax/'s code (history belongs to CHANGELOG.md and VALIDATE.md)."""
    skips, issues = {}, []
    for path in _modules():
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        if n := text.count("# fmt: skip"):
            skips[name] = n
        issues += [f"{name}: {m.group(0)}" for m in re.finditer(r"\bissue \d+", text)]
    assert set(skips) <= TABLE_MODULES, sorted(set(skips) - TABLE_MODULES)
    assert sum(skips.values()) <= 60, skips
    assert not issues, issues


# -- the kernel registry ------------------------------------------------------------------------
def _sources():
    for folder in ("kvjax", "experiments", "tests"):
        yield from (p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_each_kernel_name_is_written_once():
    """`grep -rn '"attn/scores"'` finds one definition: every other place uses the registry."""
    text = {p: p.read_text() for p in _sources() if p != Path(__file__).resolve()}
    for name, kernel in kernels.REGISTRY.items():
        if kernel.kind in (kernels.STEP, kernels.GLUE):
            continue  # "step" and "other" are also ordinary words (a training step's record)
        where = [str(p.relative_to(ROOT)) for p, s in text.items() if f'"{name}"' in s]
        # the model's parameter names `embed` and `lm_head` are attributes, not kernels
        where = [w for w in where if not (name in ("embed", "lm_head") and "kvjax/nn/" in w)]
        assert where == ["kvjax/kernels.py"], (name, where)


@pytest.mark.parametrize("preset", ["tiny-gqa", "gemma-7b", "qwen2.5-7b"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_every_closed_form_kernel_is_registered(preset, phase):
    cfg = get_model_config(preset)
    for name in analytic.step_kernels(cfg, Workload(phase, 2, 16)):
        kernel = kernels.get(name)
        assert kernel.per_layer == (name in analytic.layer_kernels(cfg, Workload(phase, 2, 16)))


def test_registry_kinds_and_members():
    assert kernels.get(kernels.ATTENTION).members == (kernels.SCORES, kernels.SOFTMAX, kernels.AV)
    matmuls = {n for n, k in kernels.REGISTRY.items() if k.kind == kernels.MATMUL}
    assert kernels.SCORES in matmuls and kernels.SOFTMAX not in matmuls
    # a matmul's traced bytes are compared strictly, so it has no explanation
    assert all(kernels.REGISTRY[n].bytes_note is None for n in matmuls)
    with pytest.raises(ValueError, match=f"unknown kernel 'attn/score'.*{kernels.SCORES}"):
        kernels.get("attn/score")


def test_einsum_letters_are_in_the_glossary():
    used = set()
    for path in (PACKAGE / "nn").glob("*.py"):
        for spec in re.findall(r'einsum\(\s*"([^"]+)"', path.read_text()):
            used |= set(re.sub(r"[^A-Za-z]", "", spec))
    assert used and used <= set(kernels.LETTERS), used - set(kernels.LETTERS)
