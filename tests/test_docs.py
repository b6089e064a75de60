"""The docs against the code they describe: every ``docs/<page>.md#<anchor>`` cited in code or docs is a heading
(or an explicit anchor) of that page, every project path a doc names exists, the README's install advice is the one
the skipped tests print, and the README's support matrix says what the architecture registry and the target and
dtype tables say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnres_export.dtypes import STORAGE_TYPES
from attnres_export.graphs.target_names import EXPORT_TARGETS, TARGETS
from attnres_export.models.registry import ARCHITECTURES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MARKDOWN = [README, *sorted(DOCS.glob("*.md"))]
CITING = [*MARKDOWN, *sorted((ROOT / "attnres_export").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
          *sorted((ROOT / "benchmarks").glob("*.py")), ROOT / "pyproject.toml"]

CITATION = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")
"""``docs/<page>.md#<anchor>`` as code and docs cite a section."""
LINK = re.compile(r"\]\(([\w./-]*?\.md)?#([\w-]+)\)")
"""A Markdown link to a section: ``[text](#anchor)`` or ``[text](<page>.md#<anchor>)``."""
EXPLICIT_ANCHOR = re.compile(r"<a (?:id|name)=\"([\w-]+)\"")
PACKAGES = sorted(p.name for p in (ROOT / "attnres_export").iterdir() if (p / "__init__.py").is_file())
PROJECT_PATH = re.compile(rf"(?<![\w/.-])((?:attnres_export/)?(?:{'|'.join(PACKAGES)})/[\w/.-]*?\."
                          r"(?:py|cu|cuh|h|cpp|txt|yaml|cmake)|(?:tests|benchmarks|examples)/[\w/.-]+\.(?:py|pt))")
"""A path of this project as docs name one: a package's file (``exporter/foreign.py``), a test, a benchmark."""
NOT_IN_THIS_TREE = {
    "ops/decompose_kimi_delta_chunked.py": "docs/models.md: a form written at an earlier commit and not kept",
    "models/glm5_next/modeling_glm5_next.py": "docs/models.md: a file of transformers, not of this project",
}


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of ``page``: its headings' slugs (repeats numbered as GitHub does) and explicit anchors,
    outside fenced code."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if heading := re.match(r"#{1,6} (.+)", line):
            slug = github_slug(heading.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
        found |= set(EXPLICIT_ANCHOR.findall(line))
    return found


def cited_sections() -> list[tuple[str, Path, str]]:
    """``(where, page, anchor)`` of every section citation in code and docs."""
    cited = []
    for source in CITING:
        text = source.read_text(encoding="utf-8")
        where = str(source.relative_to(ROOT))
        cited += [(where, DOCS / page, anchor) for page, anchor in CITATION.findall(text)]
        if source.suffix == ".md":
            cited += [(where, source.parent / page if page else source, anchor)
                      for page, anchor in LINK.findall(text)]
    return cited


def test_every_cited_section_is_a_heading_or_anchor_of_its_page() -> None:
    missing = [f"{where}: {page.relative_to(ROOT)}#{anchor}" for where, page, anchor in cited_sections()
               if not page.is_file() or anchor not in anchors(page)]
    assert not missing, f"sections cited that do not exist: {missing}"


def test_the_anchor_of_a_heading_is_githubs() -> None:
    assert github_slug("ONNX Runtime's TensorRT execution provider (`--target ort-trt`)") == (
        "onnx-runtimes-tensorrt-execution-provider---target-ort-trt")
    assert github_slug("Weights I/O") == "weights-io"


def test_every_project_path_a_doc_names_exists() -> None:
    missing = []
    for page in MARKDOWN:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for path in PROJECT_PATH.findall(line):
                if path not in NOT_IN_THIS_TREE and not ((ROOT / path).exists()
                                                         or (ROOT / "attnres_export" / path).exists()):
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert not missing, f"paths that no longer exist: {missing}"


def test_every_relative_link_of_the_docs_points_at_a_file() -> None:
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in MARKDOWN
              for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, f"links to files that do not exist: {broken}"


def skip_install_hints() -> list[str]:
    """The ``pip install ...`` commands that skipped tests print in their reason."""
    hints = []
    for source in sorted((ROOT / "tests").rglob("*.py")):
        for reason in re.findall(r'reason=((?:\s*"[^"]*")+)', source.read_text(encoding="utf-8")):
            text = "".join(re.findall(r'"([^"]*)"', reason))
            hints += re.findall(r"pip install [^\s)]+(?: [^\s)]+)*", text)
    return hints


def test_the_readme_gives_the_install_lines_the_skipped_tests_print() -> None:
    hints = skip_install_hints()
    assert any("serve" in hint for hint in hints), hints
    readme = README.read_text(encoding="utf-8").replace('"', "").replace("'", "")
    assert all(hint.replace('"', "").replace("'", "") in readme for hint in hints), hints


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose first header cell is ``first_header``, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def ticked(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


@pytest.fixture(scope="module")
def family_rows() -> dict[str, list[str]]:
    rows = table_rows(README.read_text(encoding="utf-8"), "family (`arch`)")
    return {next(iter(ticked(row[0]))): row for row in rows}


def test_the_support_matrix_has_one_row_per_registered_family(family_rows: dict[str, list[str]]) -> None:
    assert set(family_rows) == set(ARCHITECTURES)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_the_support_matrix_row_says_what_the_registry_says(name: str, family_rows: dict[str, list[str]]) -> None:
    family = ARCHITECTURES[name]
    _, reads, ops, with_past, fuse_norm, _genai = family_rows[name]
    assert set(family.hf_model_types) <= ticked(reads)
    assert ticked(ops) == set(family.capabilities.ops)
    assert with_past.startswith("yes") == family.capabilities.with_past
    assert fuse_norm.startswith("yes") == family.capabilities.fuse_norm


def test_the_support_matrix_targets_and_dtypes_are_the_code_tables() -> None:
    rows = table_rows(README.read_text(encoding="utf-8"), "target")
    by_target = {next(iter(ticked(row[0]))): row for row in rows}
    assert list(by_target) == list(TARGETS)
    for target, (_, dtypes, written_by, *_) in by_target.items():
        assert set(re.split(r",\s*", dtypes)) == set(STORAGE_TYPES), target
        assert ("`attnres-export`" in written_by) == (target in EXPORT_TARGETS), target
