"""``benchmarks/encryption.py``: its two contenders differ by encryption alone (the one
with it stores ciphertext, both replay the same bytes), and its table reports both cases."""

from __future__ import annotations

import asyncio

from benchmarks._common import call_once
from benchmarks.encryption import ENCRYPTION, RESPONSE, _memory, order_app
from idempotency_middleware import IdempotencyMiddleware, MemoryStore
from idempotency_middleware.stores.records import SealedResponse, StoredResponse


def test_the_encrypted_contender_stores_ciphertext_and_replays_the_same_bytes() -> None:
    plain_store, sealed_store = MemoryStore(), MemoryStore()
    plain = IdempotencyMiddleware(order_app, store=plain_store)
    sealed = IdempotencyMiddleware(order_app, store=sealed_store, encryption=ENCRYPTION)

    for app in (plain, sealed):
        assert asyncio.run(call_once(app, b"k")).status == 201
        replay = asyncio.run(call_once(app, b"k"))
        assert replay.status == 201 and replay.body_size == len(RESPONSE)
        assert replay.header(b"idempotent-replayed") == b"true"
    (kept,) = plain_store._records.values()
    (sealed_kept,) = sealed_store._records.values()
    assert type(kept.response) is StoredResponse
    assert type(sealed_kept.response) is SealedResponse
    assert b"4242" not in sealed_kept.response.body


def test_the_memory_table_reports_both_cases_with_and_without() -> None:
    report = asyncio.run(_memory(rounds=1, requests=5))

    assert "Encryption cost per request, ASGI middleware on MemoryStore" in report
    for case in ("| new key | wall", "| new key | CPU", "| replay  | wall", "| replay  | CPU"):
        assert case in report, report
