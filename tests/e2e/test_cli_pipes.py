"""The command line in a pipeline: a reader that stops reading (``show ... | head``) ends
the command quietly, with status 0 and nothing on standard error, as it ends ``cat``.

Real processes: ``python -m idempotency_middleware`` writing into an OS pipe whose reading
end is closed (every write fails), and into ``head -n 1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from idempotency_middleware import SQLiteStore, idempotent


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """An SQLite file holding one completed key, ``o-1``, of function ``billing.charge``,
    whose result prints as more than a pipe's buffer holds (64 KiB on Linux): ``head`` is
    gone before the command has written it all."""
    path = tmp_path / "functions.sqlite3"
    with SQLiteStore(path) as store:

        @idempotent(store=store, key="order", name="billing.charge")
        def charge(order: str) -> dict[str, object]:
            return {"order": order, "lines": list(range(40_000))}

        charge("o-1")
    return path


def show_command(database: Path) -> list[str]:
    return [
        sys.executable,
        *("-m", "idempotency_middleware", "show", "o-1"),
        *("--function", "billing.charge", "--sqlite", str(database)),
    ]


def test_show_into_a_closed_pipe_exits_0_quietly(database: Path) -> None:
    reading, writing = os.pipe()
    os.close(reading)  # the reader is gone before the first byte is written
    try:
        result = subprocess.run(
            show_command(database), stdout=writing, stderr=subprocess.PIPE, timeout=60, check=False
        )
    finally:
        os.close(writing)
    assert (result.returncode, result.stderr) == (0, b"")


@pytest.mark.skipif(shutil.which("head") is None, reason="no head(1) here")
def test_show_piped_into_head_exits_0_quietly(database: Path) -> None:
    show = subprocess.Popen(show_command(database), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert show.stdout is not None
    head = subprocess.run(
        ["head", "-n", "1"], stdin=show.stdout, capture_output=True, timeout=60, check=False
    )
    show.stdout.close()
    _, error = show.communicate(timeout=60)
    assert head.stdout == b"{\n"
    assert (show.returncode, error) == (0, b"")
