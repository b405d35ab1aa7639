"""The documents that README, DESIGN.md, docs/, the policies and the code cite are in the
repository: a reader who follows "see FACTS.md" or "tests/vm/README.md" finds it, and every
relative link of README.md and docs/*.md leads to a file that exists (and, where it names one, to
a heading of that file)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
SOURCES = [
    *REPO.glob("*.md"),
    *REPO.glob("docs/*.md"),
    *REPO.glob("policies/*.toml"),
    *REPO.glob("hostd/policy/*.toml"),
    *REPO.glob("hostd/**/*.py"),
    *REPO.glob("tests/**/*.py"),
    *REPO.glob("tests/**/*.md"),
    *REPO.glob("bench/**/*.py"),
    *REPO.glob("packaging/**/*.md"),
    *REPO.glob("deploy/**/*.md"),
]


# Names that are data, not citations: a command line in a test ("vim torchrun.md"), the made-up
# document of the link check's own test.
NOT_CITATIONS = {"torchrun.md", "x.md", "../y.md", "nowhere.md"}


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


# Markdown links and images: [text](target) and ![alt](target), an optional "title" after.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
LINKED = [REPO / "README.md", *sorted(REPO.glob("docs/*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, inline markup and punctuation
    dropped, spaces made hyphens; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(_prose(path.read_text(errors="replace"))):
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(_prose(path.read_text(errors="replace")))


def test_every_relative_link_resolves():
    """README.md and docs/*.md: a link to a file of the repository finds the file, and one with
    a #fragment into a Markdown file finds that heading."""
    broken = []
    for source in LINKED:
        for target in links(source):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
                continue
            name, _, fragment = target.partition("#")
            dest = (source.parent / name).resolve() if name else source
            where = f"{source.relative_to(REPO)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert not broken, broken


def test_the_link_check_finds_links_and_anchors(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "# A/B rollout\n\n## Scan pass (bench/scan.py)\n\n## Scan pass (bench/scan.py)\n\n"
        'See [the table](../y.md#here "title") and ![pic](top.svg).\n\n'
        "```\n[not a link](nowhere.md)\n# not a heading\n```\n"
    )
    assert links(doc) == ["../y.md#here", "top.svg"]
    assert anchors(doc) == {"ab-rollout", "scan-pass-benchscanpy", "scan-pass-benchscanpy-1"}
    # README links into docs/ and into the benchmarks' summary, and the test reads them
    readme = links(REPO / "README.md")
    assert "docs/commands.md" in readme
    assert "results-at-a-glance" in anchors(REPO / "BENCHMARKS.md")
