"""The Python a page shows, and each one run as a program of its own.

``shown_text`` is what a ``--8<-- "file:section"`` include puts on a page, taken by the
site's own extension (pymdownx.snippets), so the text run is the text read. ``run_programs``
runs many such texts fast: one server process imports the heavy libraries once (FastAPI,
boto3, Flask...) and forks a child per program, up to one per core at a time. A child is a
fresh process for the program: its own empty working directory and environment, its own
``__main__`` globals (a name the text does not import or define is a ``NameError``, whatever
the server imported), its script directory first on ``sys.path``, its non-daemon threads
waited for as the interpreter would, and its exit status the program's. Run as
``python -m tests.support.snippet_programs``: the jobs as JSON on stdin, the results on stdout.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

INCLUDE = re.compile(r'--8<-- "([^":]+)(?::([\w-]+))?"')
PYTHON_FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# Imported once by the server, before any fork: what most snippets import, and the slowest.
PRELOADED = (
    "asyncio",
    "boto3",
    "botocore.session",
    "fastapi",
    "fastapi.testclient",
    "flask",
    "pydantic",
    "starlette.applications",
    "idempotency_middleware",
)
POLL_SECONDS = 0.02


@dataclass(frozen=True)
class Include:
    """One ``--8<--`` include of a Python file: the page, the file and its section."""

    page: str
    path: str
    section: str | None

    @property
    def name(self) -> str:
        return self.path if self.section is None else f"{self.path}:{self.section}"


@dataclass(frozen=True)
class Job:
    """One program: its text, the empty directory it runs in, its whole environment."""

    name: str
    text: str
    directory: str
    env: dict[str, str]
    timeout: float


@dataclass(frozen=True)
class Result:
    """How a program ended: its exit status and what it wrote (stdout and stderr)."""

    name: str
    returncode: int
    output: str
    seconds: float


def python_includes(pages: list[Path], root: Path) -> list[Include]:
    """Every include of a ``.py`` file on ``pages``, in page order."""
    return [
        Include(page.relative_to(root).as_posix(), match.group(1), match.group(2))
        for page in pages
        for match in INCLUDE.finditer(page.read_text())
        if match.group(1).endswith(".py")
    ]


def shown_text(root: Path, path: str, section: str | None) -> str:
    """The text an include shows, as the site's extension extracts it (section markers out)."""
    import markdown  # type: ignore[import-untyped]  # Python-Markdown, MkDocs' dependency

    include = f'--8<-- "{path}"' if section is None else f'--8<-- "{path}:{section}"'
    converter = markdown.Markdown(
        extensions=["pymdownx.snippets"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(root)], "check_paths": True}},
    )
    lines: list[str] = converter.preprocessors["snippet"].run([include])
    return "\n".join(lines) + "\n"


def python_blocks(page: Path) -> list[str]:
    """The Python code blocks a page writes out (the README's quick starts)."""
    return PYTHON_FENCE.findall(page.read_text())


def run_programs(jobs: list[Job], root: Path) -> dict[str, Result]:
    """Run every job (see the module docstring); its result by name."""
    payload = json.dumps([asdict(job) for job in jobs])
    slowest = max((job.timeout for job in jobs), default=0.0)
    server = subprocess.run(
        [sys.executable, "-m", "tests.support.snippet_programs"],
        input=payload,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        # Each job has its own deadline in the server; this bounds a server that hangs.
        timeout=60 + slowest * len(jobs),
        check=False,
    )
    if server.returncode != 0:
        raise RuntimeError(f"the snippet server failed:\n{server.stdout}{server.stderr}")
    return {result["name"]: Result(**result) for result in json.loads(server.stdout)}


def _run_child(job: Job, program: Path) -> int:
    """In the forked child: become the program and run it to its end."""
    os.chdir(job.directory)
    os.environ.clear()
    os.environ.update(job.env)
    sys.argv = [str(program)]
    sys.path[0] = str(program.parent)
    try:
        runpy.run_path(str(program), run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit (the child leaves by os._exit, which does neither):
    # wait for non-daemon threads, after waking executors' idle workers (a program that leaves
    # a thread running never ends, and its deadline reports it), then the atexit functions.
    getattr(threading, "_shutdown")()  # noqa: B009 - private, and exactly that step
    getattr(atexit, "_run_exitfuncs")()  # noqa: B009
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _start(job: Job, index: int, outputs: Path) -> tuple[int, Path]:
    program = outputs / f"program-{index}" / "snippet.py"
    program.parent.mkdir()
    program.write_text(job.text)
    output = outputs / f"output-{index}.txt"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in os._exit
        code = 1
        try:
            descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(descriptor, 1)
            os.dup2(descriptor, 2)
            os.setpgid(0, 0)  # its own group: a deadline kills what it started too
            code = _run_child(job, program)
        finally:
            os._exit(code)
    return pid, output


def serve(jobs: list[Job], outputs: Path, workers: int) -> list[Result]:
    """Fork a child per job, ``workers`` at a time; collect how each ended."""
    for module in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    waiting = list(enumerate(jobs))
    running: dict[int, tuple[Job, Path, float]] = {}  # pid: the job, its output, its start
    results = []
    while waiting or running:
        while waiting and len(running) < workers:
            index, job = waiting.pop(0)
            pid, output = _start(job, index, outputs)
            running[pid] = (job, output, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for late, (job, _, started) in running.items():
                if now > started + job.timeout:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(late, signal.SIGKILL)
            time.sleep(POLL_SECONDS)
            continue
        job, output, started = running.pop(pid)
        text = output.read_text(errors="replace")
        seconds = time.monotonic() - started
        if seconds > job.timeout:
            text += f"\n[killed: still running after {job.timeout} s]"
        results.append(Result(job.name, os.waitstatus_to_exitcode(status), text, seconds))
    return results


def main() -> None:
    import shutil
    import tempfile

    jobs = [Job(**job) for job in json.load(sys.stdin)]
    # Not a TemporaryDirectory: its cleanup is an atexit function, which a child would run.
    outputs = Path(tempfile.mkdtemp(prefix="snippet-programs-"))
    try:
        results = serve(jobs, outputs, workers=os.cpu_count() or 1)
    finally:
        shutil.rmtree(outputs)
    json.dump([asdict(result) for result in results], sys.stdout)


if __name__ == "__main__":
    main()
