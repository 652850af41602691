"""The project stands alone: every doc its code and docs cite is in the repository.

Every ``docs/NAME.md`` a .py/.c/.h/.md file names, and every relative ``NAME.md`` link
inside docs/ and the README, exists in the repository; every section cited as
``docs/reference.md §N`` (or design.md) is a heading of that doc; and no file cites the
notes that lie beside the checkout and are not part of it (DESIGN.md, REFERENCE.md,
ONLINE.md, STYLE.md, or anything under ../shared/docs).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".c", ".h", ".md")
SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".pytest_cache", ".hypothesis", ".venv", "data"}
CITED_DOC = re.compile(r"\bdocs/([A-Za-z0-9_.-]+\.md)")
MD_LINK = re.compile(r"\]\(([A-Za-z0-9_./-]+\.md)(?:#[^)]*)?\)")
SECTION = re.compile(r"\b(?:docs/)?(reference|design)\.md\)?,? §(\d+)")
OUTSIDE = re.compile(r"\b(?:DESIGN|REFERENCE|ONLINE|STYLE)\.md\b|shared/docs")


def repo_files() -> list[Path]:
    out = []
    for path in REPO_ROOT.rglob("*"):
        rel = path.relative_to(REPO_ROOT)
        if path.is_file() and path.suffix in SOURCE_SUFFIXES and not SKIP_DIRS & set(rel.parts[:-1]) \
                and not any(part.startswith(".") for part in rel.parts):
            out.append(path)
    return sorted(out)


def citations(path: Path) -> list[tuple[int, str]]:
    """(line, repository path) of every doc ``path`` cites."""
    found = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        found += [(number, f"docs/{name}") for name in CITED_DOC.findall(line)]
        if path.suffix == ".md":
            for target in MD_LINK.findall(line):
                if "://" not in target:
                    resolved = (path.parent / target).resolve()
                    if resolved.is_relative_to(REPO_ROOT):
                        found.append((number, str(resolved.relative_to(REPO_ROOT))))
                    else:
                        found.append((number, target))  # outside the repository: never there
    return found


def test_the_walk_sees_the_code_and_the_docs():
    files = repo_files()
    names = {str(p.relative_to(REPO_ROOT)) for p in files}
    assert {"docs/reference.md", "docs/design.md", "traces/reader.py", "nccl_env/plugin/lagom_tuner.c",
            "README.md"} <= names
    assert len(files) > 150


def test_every_cited_doc_is_in_the_repository():
    this = Path(__file__).resolve()  # its own examples name docs that do not exist
    missing = [f"{p.relative_to(REPO_ROOT)}:{line}: cites {target}, which is not in the repository"
               for p in repo_files() if p != this
               for line, target in citations(p) if not (REPO_ROOT / target).is_file()]
    assert not missing, "\n".join(missing)


def test_every_cited_section_is_a_heading():
    headings = {doc: set(re.findall(r"^## §(\d+)", (REPO_ROOT / "docs" / f"{doc}.md").read_text(), re.M))
                for doc in ("reference", "design")}
    assert len(headings["reference"]) >= 6 and len(headings["design"]) >= 3
    bad, cited = [], 0
    for path in repo_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for doc, section in SECTION.findall(line):
                cited += 1
                if section not in headings[doc]:
                    bad.append(f"{path.relative_to(REPO_ROOT)}:{number}: {doc}.md has no §{section}")
    assert not bad, "\n".join(bad)
    assert cited >= 20  # the code's citations were found


def test_nothing_cites_notes_outside_the_repository():
    this = Path(__file__).resolve()
    bad = [f"{p.relative_to(REPO_ROOT)}:{n}: {line.strip()[:100]}"
           for p in repo_files() if p != this
           for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_a_missing_doc_and_an_outside_note(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see [the plan](nowhere.md) and docs/absent.md\nas REFERENCE.md says\n")
    assert [t for _, t in citations(page)][0] == "docs/absent.md"
    assert any(t.endswith("nowhere.md") for _, t in citations(page))
    assert OUTSIDE.search(page.read_text().splitlines()[1])
    assert SECTION.findall("a fact (docs/reference.md §3 NCCL knobs)") == [("reference", "3")]
