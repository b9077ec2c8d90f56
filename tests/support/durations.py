"""Each test file's recorded running time, for handing the files to pytest-xdist's workers.

``make test`` runs the suite with ``--dist loadfile --no-loadscope-reorder``: a file is one
unit of work, handed out in collection order. ``tests/conftest.py`` orders the files longest
first by the seconds in ``tests/durations.json``, so that no long file starts last and runs
alone while the other workers idle. ``make durations`` writes that file from a real run: with
``IDEMPOTENCY_TESTS_RECORD_DURATIONS=PATH`` set, :class:`DurationRecorder` adds up each
file's setup, call and teardown times as the reports reach the controlling process (under
xdist, the workers' reports), and writes them to ``PATH`` when the run passed; it also prints
the slowest files with their CPU seconds (:class:`CpuTimer`), to tell waiting from computing.

A file the record does not name (a new one) counts :data:`DEFAULT_SECONDS_PER_TEST` a test.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Generator, Mapping
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).resolve().parents[1] / "durations.json"
RECORD_VARIABLE = "IDEMPOTENCY_TESTS_RECORD_DURATIONS"
# What a file missing from the record counts a test: most tests are quick, and a new file
# that is not belongs in the record (make durations).
DEFAULT_SECONDS_PER_TEST = 0.1
SLOWEST_SHOWN = 15


class DurationsFileError(Exception):
    """``tests/durations.json`` is not a JSON object of file paths to seconds."""


def file_of(nodeid: str) -> str:
    """The file part of a test id, relative to the repository root: ``tests/unit/test_x.py``."""
    return nodeid.split("::", 1)[0]


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """The recorded seconds per test file; empty when there is no record yet."""
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as error:
        raise DurationsFileError(f"{path} is not JSON: {error}") from error
    if not isinstance(loaded, dict) or not all(
        isinstance(seconds, int | float) and not isinstance(seconds, bool)
        for seconds in loaded.values()
    ):
        raise DurationsFileError(f"{path} must map test file paths to seconds")
    return {str(file): float(seconds) for file, seconds in loaded.items()}


def longest_files_first(items: list[pytest.Item], durations: Mapping[str, float]) -> None:
    """Sorts ``items`` by their file's seconds, longest first; a file keeps its order."""
    tests_in: dict[str, int] = defaultdict(int)
    for item in items:
        tests_in[file_of(item.nodeid)] += 1

    def seconds(file: str) -> float:
        recorded = durations.get(file)
        return recorded if recorded is not None else tests_in[file] * DEFAULT_SECONDS_PER_TEST

    # sort is stable: a file's tests keep their order; files of equal weight go by path.
    items.sort(key=lambda item: (-seconds(file_of(item.nodeid)), file_of(item.nodeid)))


class CpuTimer:
    """Adds the CPU seconds of each phase of a test (this process's, and its children's it
    waited for) to the phase's report, as the ``cpu_seconds`` user property: a file whose CPU
    is far below its seconds waits (on a server, a subprocess, a deadline), one whose CPU is
    close to them computes. Registered in every process that runs tests."""

    def __init__(self) -> None:
        self.mark = cpu_seconds()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self) -> None:
        self.mark = cpu_seconds()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        now = cpu_seconds()
        report.user_properties.append(("cpu_seconds", now - self.mark))
        self.mark = now
        return report


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children it waited for, user and system."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class DurationRecorder:
    """A pytest plugin adding up the time of each test file, written at the end of a run.

    Registered in the controlling process only: under xdist it sees every worker's reports.
    A run that failed or was interrupted writes nothing (its times are not the suite's).
    Files this run did not collect keep their recorded seconds unless they no longer exist.
    """

    def __init__(self, path: Path, root: Path) -> None:
        self.path = path
        self.root = root
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.written = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        file = file_of(report.nodeid)
        self.seconds[file] += report.duration
        for name, value in report.user_properties:
            if name == "cpu_seconds" and isinstance(value, int | float):
                self.cpu[file] += value

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """The slowest files, their seconds beside their CPU seconds."""
        slowest = sorted(self.seconds.items(), key=lambda pair: -pair[1])[:SLOWEST_SHOWN]
        terminalreporter.write_sep("=", f"slowest {len(slowest)} files (seconds, CPU seconds)")
        for file, seconds in slowest:
            terminalreporter.write_line(f"{seconds:7.1f} {self.cpu[file]:7.1f}  {file}")
        total = sum(self.seconds.values())
        cpu = sum(self.cpu.values())
        terminalreporter.write_line(f"{total:7.1f} {cpu:7.1f}  all {len(self.seconds)} files")
        if self.written:
            terminalreporter.write_line(f"recorded in {self.path}")
        else:
            terminalreporter.write_line(f"not recorded in {self.path}: the run did not pass")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != 0 or not self.seconds:
            return
        merged = {
            file: seconds
            for file, seconds in load_durations(self.path).items()
            if (self.root / file).is_file()
        }
        merged.update({file: round(seconds, 1) for file, seconds in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=2) + "\n")
        self.written = True


def recorder_from_environment(root: Path) -> DurationRecorder | None:
    """The recorder ``IDEMPOTENCY_TESTS_RECORD_DURATIONS`` asks for, if any."""
    target = os.environ.get(RECORD_VARIABLE, "").strip()
    if not target:
        return None
    return DurationRecorder(Path(target).resolve(), root)
