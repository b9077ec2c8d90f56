"""The Python versions the package says it supports are the ones make test tests.

3.11 runs the whole suite (the Makefile's PYTHON); OTHER_PYTHONS run the part listed in
tests/other_pythons.txt (scripts/pythons.sh). requires-python and the classifiers in
pyproject.toml must name exactly these, no more and no fewer.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
# Every minor version anyone could mean, to check requires-python admits no other.
CANDIDATES = [f"3.{minor}" for minor in range(6, 20)]


def versions_tested() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    main = re.search(r"^PYTHON \?= python(3\.\d+)$", makefile, re.MULTILINE)
    others = re.search(r"^OTHER_PYTHONS := (.+)$", makefile, re.MULTILINE)
    assert main is not None and others is not None
    return {main.group(1), *others.group(1).split()}


def pyproject() -> str:
    # Read as text: tomllib is not in Python 3.10, which mypy checks the tests for.
    return (ROOT / "pyproject.toml").read_text()


def test_requires_python_admits_exactly_the_tested_versions() -> None:
    found = re.search(r'^requires-python = "(.+)"$', pyproject(), re.MULTILINE)
    assert found is not None
    specifier = SpecifierSet(found.group(1))
    admitted = {version for version in CANDIDATES if f"{version}.0" in specifier}
    assert admitted == versions_tested()


def test_the_classifiers_name_exactly_the_tested_versions() -> None:
    named = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', pyproject()))
    assert named == versions_tested()


def test_every_listed_test_file_exists_or_is_marked_optional() -> None:
    for line in (ROOT / "tests" / "other_pythons.txt").read_text().splitlines():
        path, *flags = line.partition("#")[0].split() or [""]
        if path and flags != ["optional"]:
            assert (ROOT / path).is_file(), path
