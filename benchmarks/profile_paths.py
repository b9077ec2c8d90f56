"""Profile the middleware's new-key and replay paths (MemoryStore, raw ASGI driver).

Not part of ``run_all``: run it when optimizing, before changing code.

    python -m benchmarks.profile_paths [--tool pyinstrument|cprofile] [--requests 20000]

pyinstrument (benchmarks/requirements.txt) samples the call tree; cProfile counts calls
and shows each function's own time. Both run the same loops as benchmarks.overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import io
import pstats
import uuid
from collections.abc import Sequence

from starlette.middleware import Middleware

from benchmarks._apps import order_app
from benchmarks._common import call_once, heading, machine_summary, timed_batch
from idempotency_middleware import IdempotencyMiddleware, MemoryStore


async def _loop(replay: bool, requests: int) -> None:
    app = order_app([Middleware(IdempotencyMiddleware, store=MemoryStore())])
    await call_once(app, b"replayed-key")
    if replay:
        keys: list[bytes | None] = [b"replayed-key"] * requests
    else:
        prefix = uuid.uuid4().hex[:12]
        keys = [f"{prefix}-{index:06d}".encode() for index in range(requests)]
    await timed_batch(app, keys, 201)


def _pyinstrument(replay: bool, requests: int) -> str:
    profiler_class = importlib.import_module("pyinstrument").Profiler
    profiler = profiler_class(interval=0.0001, async_mode="disabled")
    profiler.start()
    asyncio.run(_loop(replay, requests))
    profiler.stop()
    text: str = profiler.output_text(unicode=False, color=False, show_all=False)
    return text


def _cprofile(replay: bool, requests: int, top: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    asyncio.run(_loop(replay, requests))
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Profile the new-key and replay paths")
    parser.add_argument("--tool", choices=["pyinstrument", "cprofile"], default="pyinstrument")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--top", type=int, default=30, help="cProfile rows to print")
    args = parser.parse_args(argv)
    print(machine_summary())
    for replay in (False, True):
        heading(f"{args.tool}: {'replay' if replay else 'new key'} x {args.requests}")
        if args.tool == "pyinstrument":
            print(_pyinstrument(replay, args.requests))
        else:
            print(_cprofile(replay, args.requests, args.top))


if __name__ == "__main__":
    main()
