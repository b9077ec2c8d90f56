"""``DynamoDBStore`` is generated from ``AsyncDynamoDBStore`` by ``scripts/unasync.py``; this
module makes the test run fail when the two drift apart (someone edited the generated file,
or the async source without regenerating)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "unasync.py"
STORES = Path("idempotency_middleware") / "stores"
SOURCE = STORES / "dynamodb_async.py"
TARGET = STORES / "dynamodb_sync.py"


def run_unasync(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def copy_of_the_stores(root: Path) -> Path:
    """The async source and the generated sync module, copied under ``root``."""
    for path in (SOURCE, TARGET):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / path, root / path)
    return root


def test_the_sync_dynamodb_store_is_what_unasync_generates() -> None:
    result = run_unasync("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_fails_with_a_diff_when_the_sync_store_was_edited_by_hand(tmp_path: Path) -> None:
    root = copy_of_the_stores(tmp_path)
    target = root / TARGET
    target.write_text(
        target.read_text().replace("for _ in range(ddb.CLAIM_ATTEMPTS):", "for _ in range(5):")
    )
    result = run_unasync("--check", "--root", str(root))
    assert result.returncode == 1
    assert "-        for _ in range(5):" in result.stdout
    assert "+        for _ in range(ddb.CLAIM_ATTEMPTS):" in result.stdout


def test_check_fails_when_the_async_source_changed_without_regenerating(tmp_path: Path) -> None:
    root = copy_of_the_stores(tmp_path)
    source = root / SOURCE
    source.write_text(source.read_text().replace("CLAIM_ATTEMPTS", "CLAIM_TRIES"))
    result = run_unasync("--check", "--root", str(root))
    assert result.returncode == 1
    assert "+        for _ in range(ddb.CLAIM_TRIES):" in result.stdout


def test_a_substitution_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    root = copy_of_the_stores(tmp_path)
    source = root / SOURCE
    # The only sleep in the source: without it the asleep -> sleep rule has gone stale.
    source.write_text(source.read_text().replace("await self._clock.asleep(", "await wait("))
    result = run_unasync("--check", "--root", str(root))
    assert result.returncode == 2
    assert "asleep" in result.stderr


def test_generating_writes_the_sync_module(tmp_path: Path) -> None:
    root = copy_of_the_stores(tmp_path)
    (root / TARGET).unlink()
    assert run_unasync("--root", str(root)).returncode == 0
    assert (root / TARGET).read_text() == (REPO_ROOT / TARGET).read_text()
