"""What ``pip install`` and PyPI get: the sdist and the wheel, built offline with setuptools'
PEP 517 backend (the one pyproject.toml names) in a copy of the tree.

The sdist ships the package and its metadata only: the test suite needs the whole
repository (conftest, apps, servers, the Makefile, scripts), so shipping part of it would
give users tests that cannot run (MANIFEST.in prunes them).
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest

import idempotency_middleware

ROOT = Path(__file__).resolve().parents[2]
VERSION = idempotency_middleware.__version__
# Not part of any build input; the virtualenv and caches would only make the copy slow.
NOT_COPIED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".cache",
    ".*_cache",
    ".hypothesis",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
)
# Where the repository keeps things a user of the package does not run.
REPOSITORY_ONLY = ("tests/", "benchmarks/", "scripts/", "examples/")


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


def build(source: Path, into: Path, *hooks: str) -> None:
    """Run the backend's ``hooks`` (build_sdist, build_wheel) in ``source``: no network, no
    build isolation; setuptools comes from the dev extra."""
    calls = "; ".join(f"b.{hook}({str(into)!r})" for hook in hooks)
    subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta as b; {calls}"],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    source = tmp_path_factory.mktemp("tree") / "idempotency-middleware"
    shutil.copytree(ROOT, source, ignore=NOT_COPIED)
    dist = tmp_path_factory.mktemp("dist")
    build(source, dist, "build_sdist", "build_wheel")
    [sdist] = dist.glob("*.tar.gz")
    [wheel] = dist.glob("*.whl")
    return Built(sdist, wheel)


def sdist_names(sdist: Path) -> list[str]:
    """The sdist's member names without their top folder (``name-version/``)."""
    with tarfile.open(sdist) as archive:
        return [name.partition("/")[2] for name in archive.getnames()]


def metadata(text: str) -> Message:
    return email.parser.Parser().parsestr(text)


def test_the_artifacts_are_named_for_the_version_in_the_package(built: Built) -> None:
    assert built.sdist.name == f"idempotency_middleware-{VERSION}.tar.gz"
    assert built.wheel.name == f"idempotency_middleware-{VERSION}-py3-none-any.whl"


def test_the_sdist_ships_the_license_and_the_package_but_no_repository_only_folders(
    built: Built,
) -> None:
    names = sdist_names(built.sdist)
    assert "LICENSE" in names
    assert "README.md" in names
    assert "idempotency_middleware/py.typed" in names
    assert "idempotency_middleware/demo/runner.py" in names
    shipped = sorted(name for name in names if name.startswith(REPOSITORY_ONLY))
    assert shipped == []
    with tarfile.open(built.sdist) as archive:
        member = archive.extractfile(f"idempotency_middleware-{VERSION}/PKG-INFO")
        assert member is not None
        info = metadata(member.read().decode())
    assert info["Version"] == VERSION
    assert info["License-Expression"] == "MIT"


def test_the_wheel_ships_the_license_py_typed_and_the_version(built: Built) -> None:
    dist_info = f"idempotency_middleware-{VERSION}.dist-info"
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
        info = metadata(wheel.read(f"{dist_info}/METADATA").decode())
        license_text = wheel.read(f"{dist_info}/licenses/LICENSE").decode()
    assert "idempotency_middleware/py.typed" in names
    assert not [name for name in names if name.startswith(REPOSITORY_ONLY)]
    assert info["Version"] == VERSION
    assert info["License-Expression"] == "MIT"
    assert info.get_all("License-File") == ["LICENSE"]
    assert license_text.startswith("MIT License")
    assert "Copyright (c) 2026 The idempotency_middleware authors" in license_text


def test_the_sdist_alone_builds_the_same_wheel(built: Built, tmp_path: Path) -> None:
    """What pip does with an sdist: unpack it and build a wheel from it alone."""
    with tarfile.open(built.sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    rebuilt = tmp_path / "dist"
    build(tmp_path / f"idempotency_middleware-{VERSION}", rebuilt, "build_wheel")
    [wheel] = rebuilt.glob("*.whl")
    with zipfile.ZipFile(wheel) as again, zipfile.ZipFile(built.wheel) as first:
        assert sorted(again.namelist()) == sorted(first.namelist())
