"""The README is short and quotes only tested files: every code block in it is, verbatim, a
file under ``docs/snippets/`` that a test runs (the quick starts in
tests/docs/test_readme_quickstarts.py, the same files the site's Getting started includes), and
every example under ``examples/`` is included by a page of the site (whose includes
``mkdocs build --strict`` resolves), so no page shows code that drifted from its tested file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SNIPPETS = ROOT / "docs" / "snippets"
MAX_LINES = 250
MAX_QUICK_START_LINES = 15
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
INCLUDE = re.compile(r'^\s*--8<-- "([^"]+)"$', re.MULTILINE)


def readme_blocks() -> list[tuple[str, str]]:
    return [(match.group(1), match.group(2)) for match in FENCE.finditer(README.read_text())]


def snippet_files() -> dict[str, Path]:
    """Each snippet file's text, to find the file a README block quotes."""
    return {path.read_text(): path for path in SNIPPETS.rglob("*") if path.is_file()}


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_the_readme_keeps_the_two_setup_commands() -> None:
    lines = README.read_text().splitlines()
    assert any(line.startswith("make demo ") for line in lines)
    assert any(line.startswith("make test ") for line in lines)


@pytest.mark.parametrize(("language", "code"), readme_blocks())
def test_every_readme_code_block_is_a_snippet_file_verbatim(language: str, code: str) -> None:
    assert code in snippet_files(), f"README {language} block quotes no file:\n{code}"


def test_the_readme_has_a_quick_start_per_door_of_at_most_15_lines() -> None:
    quoted = {
        snippet_files()[code].name
        for language, code in readme_blocks()
        if language == "python" and code in snippet_files()
    }
    doors = {"fastapi_app.py", "flask_app.py", "django_settings.py", "functions.py"}
    assert doors <= quoted
    for name in doors:
        assert len((SNIPPETS / "quickstart" / name).read_text().splitlines()) <= (
            MAX_QUICK_START_LINES
        )


def test_the_readme_links_only_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_first_sentence_names_the_methods_covered_by_default() -> None:
    first = README.read_text().split("\n\n")[1]
    assert "POST and PATCH" in first
    package = ROOT / "idempotency_middleware" / "__init__.py"
    assert "POST and PATCH" in package.read_text().split("\n\n")[0]  # the API reference's
    # "any non-GET endpoint" was wrong: PUT and DELETE pass through unless opted in.
    for path in [README, package, *(ROOT / "docs").rglob("*.md")]:
        assert "non-GET" not in path.read_text(), path


def site_includes() -> set[str]:
    pages = (ROOT / "docs").rglob("*.md")
    return {match for page in pages for match in INCLUDE.findall(page.read_text())}


EXAMPLES = sorted(
    path.name
    for path in (ROOT / "examples").iterdir()
    if path.is_file() and path.name != "__init__.py"
)


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_is_shown_on_a_page_of_the_site(example: str) -> None:
    assert f"examples/{example}" in site_includes()


def test_every_code_block_on_the_site_is_an_include() -> None:
    """No page writes code inline: each fenced block holds one ``--8<--`` include."""
    for page in (ROOT / "docs").rglob("*.md"):
        text = page.read_text()
        for match in re.finditer(r"^(\s*)```\w*\n(.*?)^\1```$", text, re.DOTALL | re.MULTILINE):
            body = match.group(2).strip()
            assert INCLUDE.fullmatch(body), f"{page.relative_to(ROOT)}: inline code\n{body}"


# Extras for this project's own development and tests, not for its users.
DEVELOPMENT_EXTRAS = {"dev", "test-core"}


def user_facing_extras() -> set[str]:
    """The extras of this checkout's pyproject.toml (read as text: tomllib is not in Python
    3.10, which mypy checks the tests for; the installed metadata may be another checkout's)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    names = set(re.findall(r"^([\w-]+) = \[", section, re.MULTILINE))
    assert names, "no extras found in pyproject.toml"
    return names - DEVELOPMENT_EXTRAS


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_page_names_every_user_facing_extra(page: str) -> None:
    text = (ROOT / page).read_text()
    named = set(re.findall(r"`\[?([\w-]+)\]?`", text))
    missing = user_facing_extras() - named
    assert not missing, f"{page} does not name the extras {sorted(missing)}"
