"""The documents that README, DESIGN.md, the policies and the code cite are in the repository:
a reader who follows "see FACTS.md" or "tests/vm/README.md" finds it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
SOURCES = [
    *REPO.glob("*.md"),
    *REPO.glob("policies/*.toml"),
    *REPO.glob("hostd/policy/*.toml"),
    *REPO.glob("hostd/**/*.py"),
    *REPO.glob("tests/**/*.py"),
    *REPO.glob("tests/**/*.md"),
    *REPO.glob("bench/**/*.py"),
    *REPO.glob("packaging/**/*.md"),
    *REPO.glob("deploy/**/*.md"),
]


# Names that are data, not citations: a command line in a test ("vim torchrun.md").
NOT_CITATIONS = {"torchrun.md"}


def cited(path: Path) -> set[str]:
    return set(CITED.findall(path.read_text(errors="replace"))) - NOT_CITATIONS


def test_every_cited_document_exists():
    missing = []
    for source in SOURCES:
        for doc in cited(source):
            # relative to the repository's root or to the citing file's folder
            if not (REPO / doc).exists() and not (source.parent / doc).exists():
                missing.append(f"{source.relative_to(REPO)}: {doc}")
    assert not missing, missing


def test_the_check_finds_citations():
    readme = cited(REPO / "README.md")
    assert {"BENCHMARKS.md", "DESIGN.md"} <= readme
    assert "FACTS.md" in cited(REPO / "hostd" / "policy" / "training.toml")
