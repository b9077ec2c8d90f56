"""``benchmarks/instructions.py``: the summary parser, and the work its cachegrind children
run (without valgrind: the children's requests are plain in-process ASGI calls)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks._apps import HandlerRuns
from benchmarks.instructions import Counts, _drive, parse_summary

CACHEGRIND_TAIL = """\
==6854== I   refs:      485,667,746
==6854== I1  misses:      5,306,265
==6854== LLi misses:         19,946
==6854== I1  miss rate:        1.09%
==6854==
==6854== D   refs:      212,207,664  (142,454,320 rd   + 69,753,344 wr)
==6854== D1  misses:      6,795,583  (  6,128,313 rd   +    667,270 wr)
==6854== LLd misses:        300,544  (     75,420 rd   +    225,124 wr)
"""


def test_parse_summary_reads_instructions_and_l1_misses() -> None:
    assert parse_summary(CACHEGRIND_TAIL) == Counts(485_667_746, 5_306_265, 6_795_583)


def test_parse_summary_without_every_total_is_none() -> None:
    without_d1 = "\n".join(line for line in CACHEGRIND_TAIL.splitlines() if "D1" not in line)
    assert parse_summary(without_d1) is None
    assert parse_summary("valgrind: command not found") is None


@pytest.mark.parametrize(
    ("contender", "mode", "handler_runs"),
    [
        ("", "bare", 50 + 7),
        ("idempotency-middleware", "new", 50 + 7),
        ("idempotency-middleware", "replay", 1),  # only the request that completes the key
        ("floor", "new", 50 + 7),
    ],
)
def test_child_runs_warm_up_and_measured_requests(
    contender: str, mode: str, handler_runs: int
) -> None:
    before = HandlerRuns.count
    asyncio.run(_drive(contender, mode, 7))
    assert HandlerRuns.count - before == handler_runs


def test_child_refuses_an_unknown_contender() -> None:
    with pytest.raises(ValueError, match="unknown contender"):
        asyncio.run(_drive("no-such-middleware", "new", 1))
