"""Per-request overhead over a bare Starlette app, ours next to the four ASGI peers on PyPI.

Raw in-process ASGI driver (no sockets): each request builds its scope, receive and send
and awaits the app. Every round runs every contender once, in an order that rotates from
round to round; a contender's figure is the median over rounds of its mean per request,
and its overhead the median over rounds of (its mean - the bare app's mean in that round).

    python -m benchmarks.overhead [--rounds 20] [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.middleware import Middleware

from benchmarks._apps import HandlerRuns, order_app
from benchmarks._common import (
    call_once,
    heading,
    load,
    machine_summary,
    median,
    signed_us,
    table,
    timed_batch,
    us,
)
from idempotency_middleware import IdempotencyMiddleware, MemoryStore


@dataclass
class Contender:
    name: str
    distribution: str
    version: str
    kind: str
    canonical_json: str
    build: Callable[[], Starlette] | None
    error: str = ""
    new: list[float] = field(default_factory=list)
    replay: list[float] = field(default_factory=list)
    new_overhead: list[float] = field(default_factory=list)
    replay_overhead: list[float] = field(default_factory=list)


def _ours() -> Contender:
    return Contender(
        name="idempotency-middleware (ours), MemoryStore",
        distribution="idempotency-middleware",
        version=importlib.metadata.version("idempotency-middleware"),
        kind="pure ASGI",
        canonical_json="yes (orjson, sorted keys; sorted query)",
        build=lambda: order_app([Middleware(IdempotencyMiddleware, store=MemoryStore())]),
    )


def _peers() -> list[Contender]:
    """The four ASGI peers, each wired to its own in-memory backend as its README shows."""
    peers: list[Contender] = []

    header = load(
        "asgi-idempotency-header",
        {
            "middleware": ("idempotency_header_middleware", "IdempotencyHeaderMiddleware"),
            "backend": ("idempotency_header_middleware.backends.memory", "MemoryBackend"),
        },
    )
    peers.append(
        Contender(
            name="asgi-idempotency-header, MemoryBackend",
            distribution=header.distribution,
            version=header.version,
            kind="pure ASGI",
            canonical_json="no (no request fingerprint at all)",
            build=(
                (
                    lambda: order_app(
                        [
                            Middleware(
                                header.attributes["middleware"],
                                backend=header.attributes["backend"](),
                            )
                        ]
                    )
                )
                if header.available
                else None
            ),
            error=header.error,
        )
    )

    key = load(
        "fastapi-idempotency-key",
        {
            "middleware": ("fastapi_idempotency_key", "IdempotencyMiddleware"),
            "backend": ("fastapi_idempotency_key", "MemoryBackend"),
        },
    )
    peers.append(
        Contender(
            name="fastapi-idempotency-key, MemoryBackend",
            distribution=key.distribution,
            version=key.version,
            kind="pure ASGI",
            canonical_json="no (sha256 of raw body; sorted query)",
            build=(
                (
                    lambda: order_app(
                        [
                            Middleware(
                                key.attributes["middleware"], backend=key.attributes["backend"]()
                            )
                        ]
                    )
                )
                if key.available
                else None
            ),
            error=key.error,
        )
    )

    idem = load(
        "fastapi-idempotency",
        {
            "middleware": ("fastapi_idempotency", "IdempotencyMiddleware"),
            "store": ("fastapi_idempotency", "MemoryStore"),
        },
    )
    peers.append(
        Contender(
            name="fastapi-idempotency, MemoryStore",
            distribution=idem.distribution,
            version=idem.version,
            kind="BaseHTTPMiddleware",
            canonical_json="no (sha256 of raw body; raw query)",
            build=(
                (
                    lambda: order_app(
                        [
                            Middleware(
                                idem.attributes["middleware"], store=idem.attributes["store"]()
                            )
                        ]
                    )
                )
                if idem.available
                else None
            ),
            error=idem.error,
        )
    )

    fast = load(
        "fastidempotent",
        {
            "middleware": ("fastidempotent", "IdempotencyMiddleware"),
            "backend": ("fastidempotent", "MemoryBackend"),
        },
    )
    peers.append(
        Contender(
            name="fastidempotent, MemoryBackend",
            distribution=fast.distribution,
            version=fast.version,
            kind="BaseHTTPMiddleware",
            canonical_json="no (sha256 of raw body; query ignored)",
            build=(
                (
                    lambda: order_app(
                        [
                            Middleware(
                                fast.attributes["middleware"], backend=fast.attributes["backend"]()
                            )
                        ]
                    )
                )
                if fast.available
                else None
            ),
            error=fast.error,
        )
    )
    return peers


def all_contenders() -> list[Contender]:
    """Ours first, then the four peers (a peer that is not installed carries its error)."""
    return [_ours(), *_peers()]


async def measure_new(build: Callable[[], Starlette], requests: int) -> float:
    """Mean seconds per request, a fresh key each request, on a freshly built app."""
    app = build()
    warm = await call_once(app, b"warm-up")  # builds Starlette's middleware stack
    if warm.status != 201:
        raise RuntimeError(f"warm-up answered {warm.status}, not 201")
    prefix = uuid.uuid4().hex[:12]
    keys: list[bytes | None] = [f"{prefix}-{index:06d}".encode() for index in range(requests)]
    before = HandlerRuns.count
    mean = await timed_batch(app, keys, 201)
    if HandlerRuns.count - before != requests:
        raise RuntimeError("the handler did not run once per new key")
    return mean


async def _measure_replay(build: Callable[[], Starlette], requests: int) -> float:
    """Mean seconds per request, the same completed key every request."""
    app = build()
    key = b"replayed-key-0001"
    first = await call_once(app, key)
    if first.status != 201:
        raise RuntimeError(f"first request answered {first.status}, not 201")
    before = HandlerRuns.count
    second = await call_once(app, key)
    if second.status != 201 or HandlerRuns.count != before:
        raise RuntimeError("a repeated key was not replayed")
    mean = await timed_batch(app, [key] * requests, 201)
    if HandlerRuns.count != before:
        raise RuntimeError("the handler ran on a replay")
    return mean


async def _measure_no_key(requests: int) -> float:
    app = order_app([Middleware(IdempotencyMiddleware, store=MemoryStore())])
    await call_once(app, None)
    return await timed_batch(app, [None] * requests, 201)


async def _run(rounds: int, requests: int) -> str:
    contenders = all_contenders()
    bare_means: list[float] = []
    no_key: list[float] = []
    # Jobs of one round; the first round is a discarded warm-up.
    jobs: list[tuple[str, Contender | None]] = [("bare", None), ("no-key", None)]
    for contender in contenders:
        jobs += [("new", contender), ("replay", contender)]

    for round_number in range(rounds + 1):
        shift = round_number % len(jobs)
        results: dict[tuple[str, str], float] = {}
        for mode, job in jobs[shift:] + jobs[:shift]:
            if job is None:
                if mode == "bare":
                    results[("bare", "")] = await timed_batch(order_app(), [b"k"] * requests, 201)
                else:
                    results[("no-key", "")] = await _measure_no_key(requests)
                continue
            if job.build is None or job.error:
                continue
            try:
                measure = measure_new if mode == "new" else _measure_replay
                results[(mode, job.name)] = await measure(job.build, requests)
            except Exception as error:  # a broken peer is reported, the others go on
                job.error = f"failed: {error}"
        if round_number == 0:
            continue
        bare = results[("bare", "")]
        bare_means.append(bare)
        no_key.append(results[("no-key", "")] - bare)
        for contender in contenders:
            for mode, means, overheads in (
                ("new", contender.new, contender.new_overhead),
                ("replay", contender.replay, contender.replay_overhead),
            ):
                mean = results.get((mode, contender.name))
                if mean is not None:
                    means.append(mean)
                    overheads.append(mean - bare)

    bare_median = median(bare_means)
    rows = [
        [
            "bare Starlette app (no middleware)",
            importlib.metadata.version("starlette"),
            "-",
            "-",
            us(bare_median),
            "-",
            "-",
            "-",
        ]
    ]
    for contender in contenders:
        if contender.error or not contender.new or not contender.replay:
            rows.append(
                [
                    contender.name,
                    contender.version,
                    contender.kind,
                    contender.canonical_json,
                    "n/a",
                    contender.error or "n/a",
                    "n/a",
                    "",
                ]
            )
            continue
        rows.append(
            [
                contender.name,
                contender.version,
                contender.kind,
                contender.canonical_json,
                us(median(contender.new)),
                signed_us(median(contender.new_overhead)),
                us(median(contender.replay)),
                signed_us(median(contender.replay_overhead)),
            ]
        )
    out = [
        table(
            "Per-request time and overhead over the bare app (microseconds, median of round means)",
            [
                "middleware (in-memory backend)",
                "version",
                "kind",
                "JSON canonicalized for the fingerprint",
                "new key",
                "new key overhead",
                "replay",
                "replay overhead",
            ],
            rows,
        ),
        "",
        f"{rounds} interleaved rounds (+1 warm-up) x {requests} requests per contender and mode; "
        f"bare app round means {us(min(bare_means))}-{us(max(bare_means))} us.",
        f"Our pass-through (covered route, no key): {signed_us(median(no_key))} us over bare.",
    ]
    ours = contenders[0]
    peers = [peer for peer in contenders[1:] if peer.new_overhead and not peer.error]
    if ours.new_overhead and peers:
        lightest = min(peers, key=lambda peer: median(peer.new_overhead))
        ours_new = median(ours.new_overhead)
        lightest_new = median(lightest.new_overhead)
        # Not a target any more: with canonical JSON the least a new key can cost already
        # equals the lightest peer's (make bench-floor keeps that as a regression guard).
        out.append(
            f"New key next to the lightest peer ({lightest.distribution} "
            f"{signed_us(lightest_new)} us, raw-body fingerprint): ours {signed_us(ours_new)} us "
            "(canonical JSON; its floor: make bench-floor)."
        )
    if ours.replay:
        ours_replay = median(ours.replay)
        verdict = "met" if ours_replay < bare_median else "NOT met"
        out.append(
            f"Target replay < bare app ({us(bare_median)} us): ours {us(ours_replay)} us "
            f"-> {verdict}."
        )
    return "\n".join(out)


def run(rounds: int = 20, requests: int = 500) -> str:
    return asyncio.run(_run(rounds, requests))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args(argv)
    heading("overhead: raw ASGI driver, in-memory backends")
    print(run(args.rounds, args.requests), flush=True)


if __name__ == "__main__":
    print(machine_summary())
    main()
