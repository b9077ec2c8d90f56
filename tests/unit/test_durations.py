"""``tests/support/durations.py``: the files go to xdist's workers longest first by their
recorded seconds, and ``make durations`` records only a run that passed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from tests.support.durations import (
    DurationRecorder,
    DurationsFileError,
    load_durations,
    longest_files_first,
)


@dataclass
class Item:
    nodeid: str


@dataclass
class Report:
    nodeid: str
    duration: float
    user_properties: list[tuple[str, object]]


def ordered(nodeids: list[str], durations: dict[str, float]) -> list[str]:
    items = [Item(nodeid) for nodeid in nodeids]
    longest_files_first(cast(list[pytest.Item], items), durations)
    return [item.nodeid for item in items]


def test_files_go_longest_first_and_each_keeps_the_order_of_its_tests() -> None:
    nodeids = ["tests/a.py::one", "tests/b.py::one", "tests/a.py::two", "tests/c.py::one"]
    durations = {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0}
    assert ordered(nodeids, durations) == [
        "tests/b.py::one",
        "tests/c.py::one",
        "tests/a.py::one",
        "tests/a.py::two",
    ]


def test_a_file_not_recorded_counts_a_tenth_of_a_second_a_test() -> None:
    new = [f"tests/new.py::t{number}" for number in range(30)]  # 3 s
    assert ordered(["tests/old.py::t", *new], {"tests/old.py": 2.0})[0] == "tests/new.py::t0"
    assert ordered(["tests/old.py::t", *new], {"tests/old.py": 4.0})[0] == "tests/old.py::t"


def test_no_record_yet_is_an_empty_one(tmp_path: Path) -> None:
    assert load_durations(tmp_path / "durations.json") == {}


@pytest.mark.parametrize("text", ["{", '["tests/a.py"]', '{"tests/a.py": "12"}'])
def test_a_record_that_is_not_seconds_by_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "durations.json"
    path.write_text(text)
    with pytest.raises(DurationsFileError, match=str(path)):
        load_durations(path)


def recorded_run(tmp_path: Path, exitstatus: int) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").touch()
    (tmp_path / "tests" / "test_kept.py").touch()
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/test_kept.py": 7.0, "tests/test_gone.py": 9.0}))
    recorder = DurationRecorder(path, tmp_path)
    for phase_seconds in (0.25, 1.5, 0.25):
        cpu: list[tuple[str, object]] = [("cpu_seconds", phase_seconds / 2)]
        recorder.pytest_runtest_logreport(
            cast(pytest.TestReport, Report("tests/test_a.py::t", phase_seconds, cpu))
        )
    recorder.pytest_sessionfinish(cast(pytest.Session, None), exitstatus)
    assert recorder.cpu == {"tests/test_a.py": 1.0}
    return path


def test_a_passing_run_records_its_files_and_keeps_those_it_did_not_run(
    tmp_path: Path,
) -> None:
    path = recorded_run(tmp_path, exitstatus=0)
    assert json.loads(path.read_text()) == {"tests/test_a.py": 2.0, "tests/test_kept.py": 7.0}


def test_a_failing_run_records_nothing(tmp_path: Path) -> None:
    path = recorded_run(tmp_path, exitstatus=1)
    assert json.loads(path.read_text()) == {"tests/test_kept.py": 7.0, "tests/test_gone.py": 9.0}
