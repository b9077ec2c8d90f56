#!/usr/bin/env python3
"""Generate the sync DynamoDB store from the async one (httpcore's ``unasync`` idea).

    scripts/unasync.py            rewrite idempotency_middleware/stores/dynamodb_sync.py
    scripts/unasync.py --check    exit 1, with a diff, when it differs from what would be
                                  generated (tests/test_unasync.py runs this)

``dynamodb_async.py`` is the one source. Each line goes through token substitutions
(``async def`` -> ``def``, ``await`` dropped, ``aclaim`` -> ``claim``, ``AsyncClients`` ->
``SyncClients`` ...); what differs beyond that (creating, reading and closing aioboto3 or boto3
clients) lives in the two small bases of ``dynamodb_clients.py``. Lines between
``# unasync: begin async-only`` and ``# unasync: end async-only`` are dropped. The module
docstring is replaced, and the result is formatted with ``ruff format`` (dropping ``await``
shortens lines, which the formatter may then join). A substitution that no longer matches
anything is an error, so the list cannot silently rot.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORES = Path("idempotency_middleware") / "stores"
SOURCE = STORES / "dynamodb_async.py"
TARGET = STORES / "dynamodb_sync.py"

SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"async def", "def"),
    (r"async with", "with"),
    (r"await ", ""),
    (r"AsyncDynamoDBStore", "DynamoDBStore"),
    (r"AsyncClients", "SyncClients"),
    (r"aioboto3", "boto3"),
    (r"ASGI", "WSGI"),
    (r"aclaim", "claim"),
    (r"acomplete", "complete"),
    (r"arelease", "release"),
    (r"arenew", "renew"),
    (r"aget", "get"),
    (r"adelete", "delete"),
    (r"acreate_table", "create_table"),
    (r"aclose", "close"),
    (r"asleep", "sleep"),
]
_COMPILED = [(re.compile(rf"\b{pattern}"), replacement) for pattern, replacement in SUBSTITUTIONS]

BEGIN_ASYNC_ONLY = "# unasync: begin async-only"
END_ASYNC_ONLY = "# unasync: end async-only"

DOCSTRING = '''"""``DynamoDBStore``: the DynamoDB store on boto3, for the WSGI middleware.

Generated from ``dynamodb_async.py`` by ``scripts/unasync.py``: do not edit; edit the async
store and run the script.
"""
'''


class UnasyncError(Exception):
    """The source cannot be turned into the sync module as it stands."""


def _without_docstring(source: str) -> str:
    if not source.startswith('"""'):
        raise UnasyncError(f"{SOURCE} must open with its module docstring")
    end = source.index('"""', 3) + 3
    return source[end:].lstrip("\n")


def _without_async_only(lines: list[str]) -> list[str]:
    kept: list[str] = []
    dropping = False
    for number, line in enumerate(lines, 1):
        marker = line.strip()
        if marker == BEGIN_ASYNC_ONLY:
            if dropping:
                raise UnasyncError(f"{SOURCE}:{number}: nested {BEGIN_ASYNC_ONLY!r}")
            dropping = True
        elif marker == END_ASYNC_ONLY:
            if not dropping:
                raise UnasyncError(f"{SOURCE}:{number}: {END_ASYNC_ONLY!r} without a begin")
            dropping = False
        elif not dropping:
            kept.append(line)
    if dropping:
        raise UnasyncError(f"{SOURCE}: {BEGIN_ASYNC_ONLY!r} is never ended")
    return kept


def unasync(source: str) -> str:
    """The sync module's text (before formatting) for the async module's ``source``."""
    used: set[int] = set()
    lines: list[str] = []
    for line in _without_async_only(_without_docstring(source).splitlines(keepends=True)):
        for index, (pattern, replacement) in enumerate(_COMPILED):
            line, count = pattern.subn(replacement, line)
            if count:
                used.add(index)
        lines.append(line)
    if len(used) != len(_COMPILED):
        unused = [SUBSTITUTIONS[index][0] for index in range(len(_COMPILED)) if index not in used]
        raise UnasyncError(f"substitutions that match nothing in {SOURCE}: {unused}")
    for line in lines:
        if re.search(r"\b(async|await)\b", line):
            raise UnasyncError(f"left after substitution: {line.strip()!r}")
    return DOCSTRING + "\n" + "".join(lines)


def formatted(text: str) -> str:
    """``text`` as ``ruff format`` leaves it, with the project's settings."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--stdin-filename",
            str(ROOT / TARGET),
            "-",
        ],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise UnasyncError(f"ruff format failed: {result.stderr.strip()}")
    return result.stdout


def generate(root: Path) -> str:
    """The sync module as it should be, from the async source under ``root``."""
    return formatted(unasync((root / SOURCE).read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if the sync module is not up to date"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this)")
    arguments = parser.parse_args(argv)
    root: Path = arguments.root
    try:
        expected = generate(root)
    except UnasyncError as error:
        print(f"unasync: {error}", file=sys.stderr)
        return 2
    target = root / TARGET
    if not arguments.check:
        target.write_text(expected, encoding="utf-8")
        print(f"unasync: wrote {TARGET}")
        return 0
    actual = target.read_text(encoding="utf-8") if target.exists() else ""
    if actual == expected:
        print(f"unasync: {TARGET} is up to date")
        return 0
    diff = difflib.unified_diff(
        actual.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=f"{TARGET} (as it is)",
        tofile=f"{TARGET} (generated from {SOURCE})",
    )
    sys.stdout.writelines(diff)
    print(f"unasync: {TARGET} differs from its source; run scripts/unasync.py", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
