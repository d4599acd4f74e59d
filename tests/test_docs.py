"""The README is a first screen and a map (issue 39): short, and every link in it and in the
documents it points to lands on a file and a heading that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "configs/README.md", "experiments/README.md",
        "experiments/published/README.md", "experiments/published/VALIDATE.md",
        "kvjax/README.md", "kvjax/analytic/README.md",
        "kvjax/traced/README.md", "kvjax/measured/README.md", "kvjax/nn/README.md",
        "kvjax/plotting/README.md"]  # fmt: skip


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    t = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return t.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {_slug(line) for line in lines if re.match(r"^#{1,6} ", line)}


def test_readme_is_a_first_screen_and_a_map():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 350
    assert "python3 -m pip install -e . && python3 -m kvjax run" in text
    assert "bash .ci/run" in text
    linked = set(re.findall(r"\]\(([^)#]+)", text))
    assert set(DOCS[1:]) <= linked


@pytest.mark.parametrize("doc", DOCS)
def test_links_land(doc):
    path = ROOT / doc
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"^(https?:|mailto:)", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            missing.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            missing.append(target)
    assert not missing, missing
