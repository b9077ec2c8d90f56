"""Stored responses: encoding, header filtering for storage and replay, record deadlines."""

from __future__ import annotations

import os
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_middleware.stores.records import (
    COMPRESS_THRESHOLD,
    Record,
    Status,
    StoredResponse,
    decode_response,
    encode_response,
    storable_headers,
)
from idempotency_middleware.web.capture import BodyBuffer

PURE = settings(max_examples=200, deadline=None)

headers_strategy = st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=40)), max_size=8)
bodies = st.one_of(
    st.binary(max_size=3000),
    st.builds(
        lambda chunk, count: chunk * count, st.binary(min_size=1, max_size=8), st.integers(1, 800)
    ),
)

# --- encoding ---------------------------------------------------------------------------


@PURE
@given(st.integers(min_value=100, max_value=599), headers_strategy, bodies)
def test_encoded_response_decodes_to_the_same_response(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    response = StoredResponse(status, headers, body)
    assert decode_response(encode_response(response)) == response


def test_large_compressible_body_is_compressed() -> None:
    response = StoredResponse(200, [(b"content-type", b"text/plain")], b"abc" * 100_000)
    encoded = encode_response(response)
    assert len(encoded) < len(response.body) // 10
    assert decode_response(encoded) == response


def test_incompressible_body_is_stored_plain() -> None:
    body = os.urandom(50_000)
    response = StoredResponse(200, [], body)
    encoded = encode_response(response)
    # Plain storage costs a few bytes of framing, never a zlib expansion.
    assert len(body) < len(encoded) <= len(body) + 64
    assert decode_response(encoded) == response


def test_small_body_is_stored_plain() -> None:
    response = StoredResponse(201, [], b"a" * (COMPRESS_THRESHOLD // 4))
    encoded = encode_response(response)
    assert response.body in encoded
    assert decode_response(encoded) == response


def test_encoded_response_preserves_header_order_case_and_repeats() -> None:
    headers = [
        (b"X-B", b"2"),
        (b"x-a", b"1"),
        (b"Vary", b"Accept"),
        (b"Vary", b"Origin"),
        (b"x-latin", bytes(range(0x80, 0x100))),
    ]
    response = StoredResponse(200, headers, b"")
    assert decode_response(encode_response(response)).headers == headers


def test_unknown_encoding_format_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_response(b"\x09garbage")


# --- headers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        b"Connection",
        b"keep-alive",
        b"Transfer-Encoding",
        b"TE",
        b"Trailer",
        b"Upgrade",
        b"Proxy-Authenticate",
        b"Proxy-Authorization",
        b"Proxy-Connection",
        b"Set-Cookie",
        b"set-cookie",
        b"Idempotent-Replayed",
    ],
)
def test_storable_headers_drop_connection_and_session_headers(name: bytes) -> None:
    kept = storable_headers([(b"content-type", b"application/json"), (name, b"x")])
    assert kept == [(b"content-type", b"application/json")]


def test_storable_headers_keep_end_to_end_headers_in_order() -> None:
    headers = [
        (b"Content-Type", b"application/json"),
        (b"Location", b"/orders/1"),
        (b"ETag", b'"v1"'),
        (b"Cache-Control", b"no-store"),
        (b"X-Request-Id", b"abc"),
        (b"Vary", b"A"),
        (b"Vary", b"B"),
    ]
    kept = storable_headers(headers)
    assert kept == headers and kept is not headers  # a copy: the app's list stays its own


def test_storable_headers_are_tuples_whatever_pairs_the_app_sent() -> None:
    # ASGI allows [name, value] lists and any iterable of them.
    pairs: Any = [[b"content-type", b"text/plain"], [b"x-order", b"1"]]
    assert storable_headers(pairs) == [(b"content-type", b"text/plain"), (b"x-order", b"1")]
    once: Any = iter([(b"x-order", b"1")])
    assert storable_headers(once) == [(b"x-order", b"1")]


def header_values(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key.lower() == name]


@PURE
@given(headers_strategy, st.binary(max_size=2000))
def test_replay_headers_carry_a_correct_content_length_and_the_marker(
    headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    response = StoredResponse(200, storable_headers(headers), body)
    replayed = response.replay_headers()
    assert header_values(replayed, b"content-length") == [str(len(body)).encode()]
    assert header_values(replayed, b"idempotent-replayed") == [b"true"]
    others = [
        (name, value) for name, value in response.headers if name.lower() != b"content-length"
    ]
    assert [
        (name, value)
        for name, value in replayed
        if name.lower() not in {b"content-length", b"idempotent-replayed"}
    ] == others


def test_storable_headers_keep_content_length_in_place() -> None:
    # Header order is part of "byte for byte"; the value itself is recomputed on replay.
    headers = [(b"content-type", b"text/plain"), (b"Content-Length", b"2"), (b"x-a", b"1")]
    assert storable_headers(headers) == headers


def test_replay_recomputes_a_stored_content_length_in_place() -> None:
    response = StoredResponse(
        200,
        [(b"content-type", b"text/plain"), (b"Content-Length", b"999"), (b"x-a", b"1")],
        b"hello",
    )
    assert response.replay_headers() == [
        (b"content-type", b"text/plain"),
        (b"Content-Length", b"5"),
        (b"x-a", b"1"),
        (b"idempotent-replayed", b"true"),
    ]


def test_replay_never_sends_two_content_lengths() -> None:
    response = StoredResponse(200, [(b"content-length", b"1"), (b"content-length", b"2")], b"abc")
    assert header_values(response.replay_headers(), b"content-length") == [b"3"]


def test_replay_headers_of_an_empty_body() -> None:
    replayed = StoredResponse(204, [], b"").replay_headers()
    assert (b"content-length", b"0") in replayed
    assert (b"idempotent-replayed", b"true") in replayed


# --- records ----------------------------------------------------------------------------


def record(
    status: Status, *, lock_expires_at: float, expires_at: float, response: bool = False
) -> Record:
    return Record(
        key_hash="k",
        status=status,
        fingerprint="f",
        owner="o",
        lock_expires_at=lock_expires_at,
        expires_at=expires_at,
        response=StoredResponse(200, [], b"ok") if response else None,
    )


def test_in_progress_record_within_its_lock_is_not_claimable() -> None:
    held = record(Status.IN_PROGRESS, lock_expires_at=100.0, expires_at=100.0)
    assert not held.is_lock_stale(99.999)
    assert not held.is_claimable(99.999)


def test_in_progress_record_past_its_lock_is_claimable() -> None:
    held = record(Status.IN_PROGRESS, lock_expires_at=100.0, expires_at=200.0)
    assert held.is_lock_stale(100.0)
    assert held.is_claimable(100.5)
    assert not held.is_expired(100.5)


def test_completed_record_within_its_ttl_is_not_claimable_even_past_its_old_lock() -> None:
    done = record(Status.COMPLETED, lock_expires_at=10.0, expires_at=1000.0, response=True)
    assert not done.is_lock_stale(500.0)
    assert not done.is_claimable(500.0)


def test_completed_record_past_its_ttl_is_claimable() -> None:
    done = record(Status.COMPLETED, lock_expires_at=10.0, expires_at=1000.0, response=True)
    assert done.is_expired(1000.0)
    assert done.is_claimable(1000.001)


def test_deadlines_have_sub_second_precision() -> None:
    done = record(Status.COMPLETED, lock_expires_at=0.0, expires_at=1000.25)
    assert not done.is_claimable(1000.2)
    assert done.is_claimable(1000.3)


# --- buffering a response body ---------------------------------------------------------


@PURE
@given(st.lists(st.binary(max_size=300), max_size=12))
def test_body_buffer_gives_back_the_chunks_joined(chunks: list[bytes]) -> None:
    buffer = BodyBuffer()
    for chunk in chunks:
        buffer.add(chunk)
    assert buffer.take() == b"".join(chunks)
    assert buffer.take() == b""  # emptied by take()


def test_body_buffer_keeps_a_single_chunk_without_copying_it() -> None:
    chunk = os.urandom(1000)
    buffer = BodyBuffer()
    buffer.add(b"")
    buffer.add(chunk)
    buffer.add(b"")
    assert buffer.take() is chunk


@pytest.mark.parametrize("declared", [None, 64 * 1024 * 32, 64 * 1024 * 40, 100])
def test_body_buffer_is_exact_whatever_length_was_declared(declared: int | None) -> None:
    chunks = [os.urandom(64 * 1024) for _ in range(32)]
    buffer = BodyBuffer()
    buffer.expected_size = declared  # right, too large (app sent less), too small
    for chunk in chunks:
        buffer.add(chunk)
    assert buffer.take() == b"".join(chunks)


def test_body_buffer_peaks_near_one_copy_of_a_chunked_body() -> None:
    chunk_size, count = 64 * 1024, 32
    tracemalloc.start()
    try:
        buffer = BodyBuffer()
        buffer.expected_size = chunk_size * count  # the app's Content-Length
        for _ in range(count):
            buffer.add(os.urandom(chunk_size))  # each chunk dropped once added, as an app does
        body = buffer.take()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) == chunk_size * count
    # A list of chunks and their join would peak at 2x.
    assert peak < 1.5 * len(body)


def test_one_scan_of_response_headers_finds_streaming_and_the_declared_length() -> None:
    from idempotency_middleware.web.capture import scan_response_headers

    assert scan_response_headers(
        [(b"Content-Type", b"text/event-stream; charset=utf-8"), (b"Content-Length", b"12")]
    ) == (True, 12)
    assert scan_response_headers([(b"content-type", b"application/json")]) == (False, None)
    assert scan_response_headers([(b"content-length", b"twelve")]) == (False, None)


def test_the_first_content_type_and_content_length_of_a_response_count() -> None:
    from idempotency_middleware.web.capture import scan_response_headers

    assert scan_response_headers(
        [
            (b"content-type", b"application/json"),
            (b"content-length", b"3"),
            (b"content-type", b"text/event-stream"),
            (b"content-length", b"9"),
        ]
    ) == (False, 3)


def test_headers_named_by_connection_are_not_stored() -> None:
    # RFC 9110 7.6.1: a header the Connection header names is hop-by-hop, whatever its name.
    headers = [
        (b"Content-Type", b"application/json"),
        (b"Connection", b" X-Hop , keep-alive,,x-other"),
        (b"x-hop", b"1"),
        (b"X-Other", b"2"),
        (b"connection", b"X-Third"),
        (b"X-THIRD", b"3"),
        (b"X-Kept", b"4"),
    ]
    assert storable_headers(headers) == [
        (b"Content-Type", b"application/json"),
        (b"X-Kept", b"4"),
    ]


def test_a_connection_header_naming_nothing_drops_nothing_else() -> None:
    headers = [(b"connection", b"close"), (b"x-close", b"1"), (b"close-x", b"2")]
    assert storable_headers(headers) == [(b"x-close", b"1"), (b"close-x", b"2")]
