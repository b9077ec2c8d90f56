"""Peak memory while the middleware buffers and stores a large response (MemoryStore).

The app makes its body while the request runs, either as one ``http.response.body``
message or as 64 KiB chunks; the raw ASGI driver drops what it receives. Peaks are
``tracemalloc`` peaks over one request (everything Python allocates for it, the app's own
body included) and the growth of the process's resident high-water mark (VmHWM, reset
before each request), both as a multiple of the body size.

    python -m benchmarks.memory [--sizes 1 10 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import tracemalloc
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from benchmarks._common import call_once, heading, machine_summary, table
from idempotency_middleware import IdempotencyMiddleware, MemoryStore

MB = 1024 * 1024
CHUNK = 64 * 1024


class LargeResponseApp:
    """Answers 200 with ``size`` bytes of application/octet-stream, made per request."""

    def __init__(self, size: int, chunked: bool, declares_length: bool = True) -> None:
        self.size = size
        self.chunked = chunked
        self.declares_length = declares_length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message: Message = await receive()
        while message.get("more_body", False):
            message = await receive()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/octet-stream")]
                + ([(b"content-length", str(self.size).encode())] if self.declares_length else []),
            }
        )
        if not self.chunked:
            await send({"type": "http.response.body", "body": b"x" * self.size})
            return
        remaining = self.size
        while remaining > 0:
            piece = min(CHUNK, remaining)
            remaining -= piece
            await send(
                {"type": "http.response.body", "body": b"x" * piece, "more_body": remaining > 0}
            )


def _trim() -> None:
    """Give freed heap back to the OS so the next high-water mark starts clean."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


async def _peak(app: ASGIApp, key: bytes, size: int) -> tuple[float, float | None]:
    """(traced peak, VmHWM growth) of one request, as multiples of ``size``."""
    _trim()
    can_reset = _reset_high_water()
    rss_before = _status_kib("VmRSS")
    tracemalloc.reset_peak()
    traced_before = tracemalloc.get_traced_memory()[0]
    exchange = await call_once(app, key)
    traced_peak = tracemalloc.get_traced_memory()[1] - traced_before
    rss_growth = (_status_kib("VmHWM") - rss_before) * 1024 if can_reset else None
    if exchange.status != 200 or exchange.body_size != size:
        raise RuntimeError(f"got {exchange.status} with {exchange.body_size} bytes")
    return traced_peak / size, (rss_growth / size if rss_growth is not None else None)


def _shape(size: int, chunked: bool, declares_length: bool) -> str:
    if not chunked:
        return "one message"
    length = "Content-Length" if declares_length else "no Content-Length"
    return f"{size // CHUNK} x 64 KiB messages, {length}"


def _x(multiple: float | None) -> str:
    return "n/a" if multiple is None else f"{multiple:.2f}x"


async def _run(sizes_mb: Sequence[int]) -> str:
    rows: list[list[str]] = []
    worst = 0.0
    tracemalloc.start()
    try:
        for size_mb in sizes_mb:
            size = size_mb * MB
            for chunked, declares_length in ((False, True), (True, True), (True, False)):
                inner = LargeResponseApp(size, chunked, declares_length)
                bare_traced, _ = await _peak(inner, b"bare", size)
                store = MemoryStore()
                app = IdempotencyMiddleware(inner, store=store)
                traced, rss = await _peak(app, b"large-response", size)
                replay_traced, _ = await _peak(app, b"large-response", size)
                worst = max(worst, traced)
                rows.append(
                    [
                        f"{size_mb} MB",
                        _shape(size, chunked, declares_length),
                        _x(bare_traced),
                        _x(traced),
                        _x(rss),
                        _x(replay_traced),
                    ]
                )
                del app, store, inner
    finally:
        tracemalloc.stop()
    # 1% slack: per-request allocations (scope, headers, records) add a few KiB to a 1 MB body.
    verdict = "met" if worst <= 2.02 else "NOT met"
    return "\n".join(
        [
            table(
                "Peak memory of one request, as a multiple of the response body size",
                [
                    "response",
                    "app sends it as",
                    "bare app (traced)",
                    "middleware, new key (traced)",
                    "middleware, new key (RSS high-water growth)",
                    "middleware, replay (traced)",
                ],
                rows,
            ),
            "",
            "Traced peaks include the app's own body (1x when it makes it in one piece). "
            "A chunked body with a Content-Length fills one buffer of that size, handed over "
            "without a copy (about 1x); without one, the chunks and their join (2x). "
            f"Target: peak within 2x the body -> worst {worst:.2f}x, {verdict}.",
        ]
    )


def run(sizes_mb: Sequence[int] = (1, 10, 50)) -> str:
    return asyncio.run(_run(sizes_mb))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Peak memory for large buffered responses")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 50], metavar="MB")
    args = parser.parse_args(argv)
    heading("memory: buffering and storing large responses (MemoryStore, raw ASGI)")
    print(run(args.sizes), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
