"""The Django door (``IdempotencyDjangoMiddleware`` in ``MIDDLEWARE``), through real servers.

Django's WSGI handler is served by waitress, its ASGI handler by uvicorn (the sync
middleware adapted by Django), both on 127.0.0.1, and driven with httpx. The project is
tests/support/django_project.py: ``path("orders/<int:order_id>", ...)`` and friends. Each test
builds its own handler under ``override_settings(IDEMPOTENCY=...)``; the middleware reads the
setting once, when the handler loads it.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyRule,
    MemoryStore,
    RequestView,
    StoreUnavailable,
)
from idempotency_middleware.django import IdempotencyDjangoMiddleware
from idempotency_middleware.stores.protocol import ClaimRequest, ClaimResult
from idempotency_middleware.testing import FakeClock
from tests.conftest import REGION
from tests.e2e.test_adapter_paths import EventLog, assert_problem, read_rest, read_until
from tests.support import django_project as project  # configures Django's settings once
from tests.support.apps import STREAM_FIRST_CHUNK, STREAM_LAST_CHUNK, AppState
from tests.support.servers import CLIENT_TIMEOUT_SECONDS, serve_asgi, serve_wsgi

HEADER = "Idempotency-Key"
ORDER = {"item": "book", "quantity": 2}
WAIT_TIMEOUT_SECONDS = 10.0


def new_key() -> str:
    return f"django-{uuid.uuid4()}"


def keyed(key: str) -> dict[str, str]:
    return {HEADER: key}


# --- stores that let a test see or break what the middleware asks of them -----------------


class WatchedStore(MemoryStore):
    """A ``MemoryStore`` that counts its calls, so a test can wait for one (a waiter's poll,
    a lease renewal) without sleeping."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._condition = threading.Condition()
        self._calls: Counter[str] = Counter()

    def _seen(self, operation: str) -> None:
        with self._condition:
            self._calls[operation] += 1
            self._condition.notify_all()

    def wait_for(self, operation: str, count: int) -> bool:
        with self._condition:
            return self._condition.wait_for(
                lambda: self._calls[operation] >= count, WAIT_TIMEOUT_SECONDS
            )

    def claim(self, request: ClaimRequest) -> ClaimResult:
        result = super().claim(request)
        self._seen("claim")
        return result

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> bool:
        renewed = super().renew(key_hash, owner, lock_expires_at)
        self._seen("renew")
        return renewed


class UnreachableStore(MemoryStore):
    """A store whose claims fail, as an unreachable backend's do."""

    def claim(self, request: ClaimRequest) -> ClaimResult:
        raise StoreUnavailable("the store is unreachable (test)")


def make_store() -> MemoryStore:
    """A zero-argument factory, named by a dotted path in the setting."""
    return MemoryStore()


# --- handlers and servers --------------------------------------------------------------------


def build_handler(handler_class: type[Any], config: dict[str, Any]) -> Any:
    """A Django handler whose middleware was built from ``IDEMPOTENCY = config``."""
    with override_settings(IDEMPOTENCY=config):
        return handler_class()


def our_middleware(handler: Any) -> IdempotencyDjangoMiddleware:
    """The middleware instance inside a handler's chain: each layer is wrapped by Django
    (functools.wraps, and sync_to_async under ASGI) and holds the next as get_response."""
    layer = handler._middleware_chain
    while not isinstance(layer, IdempotencyDjangoMiddleware):
        layer = inspect.unwrap(layer)
        layer = layer if isinstance(layer, IdempotencyDjangoMiddleware) else layer.get_response
    return layer


def mounted(app: Callable[..., Iterable[bytes]], prefix: str) -> Callable[..., Iterable[bytes]]:
    """The WSGI app mounted under ``prefix``: SCRIPT_NAME set, PATH_INFO relative to it."""

    def mounted_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ["SCRIPT_NAME"] = prefix
        environ["PATH_INFO"] = environ["PATH_INFO"].removeprefix(prefix)
        return app(environ, start_response)

    return mounted_app


@dataclass(frozen=True)
class Served:
    client: httpx.Client
    state: AppState
    events: EventLog
    middleware: IdempotencyDjangoMiddleware

    def post_order(self, key: str, order_id: int = 7, **kwargs: Any) -> httpx.Response:
        return self.client.post(f"/orders/{order_id}", json=ORDER, headers=keyed(key), **kwargs)


class DjangoServers:
    """Serves the project with the middleware configured as a test asks; everything started
    is stopped when the test ends (client, then server, then the renewal thread)."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack

    def start(
        self, *, store: object = None, asgi: bool = False, prefix: str = "", **options: Any
    ) -> Served:
        state, events = AppState(), EventLog()
        project.use_state(state)
        options.setdefault("on_event", events)
        config = {"store": MemoryStore() if store is None else store, **options}
        handler = build_handler(ASGIHandler if asgi else WSGIHandler, config)
        middleware = our_middleware(handler)
        self._stack.callback(middleware.close)
        if asgi:
            url = self._stack.enter_context(serve_asgi(handler))
        else:
            url = self._stack.enter_context(serve_wsgi(mounted(handler, prefix)))
        client = httpx.Client(base_url=url, trust_env=False, timeout=CLIENT_TIMEOUT_SECONDS)
        self._stack.callback(client.close)
        return Served(client, state, events, middleware)


@pytest.fixture
def django_servers() -> Iterator[DjangoServers]:
    with contextlib.ExitStack() as stack:
        yield DjangoServers(stack)


def assert_replay_of(replay: httpx.Response, first: httpx.Response) -> None:
    """Byte for byte: status, body and the view's headers, marked, without its cookie."""
    assert replay.headers.get("idempotent-replayed") == "true"
    assert replay.status_code == first.status_code
    assert replay.content == first.content
    for name in ("content-type", "x-order", "content-length"):
        assert replay.headers.get(name) == first.headers.get(name), name
    assert "set-cookie" not in replay.headers


# --- the contract ------------------------------------------------------------------------------


def test_a_new_key_runs_the_view_once_and_its_retry_is_replayed_byte_for_byte(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()

    first = served.post_order(key)
    retry = served.post_order(key)

    assert first.status_code == 201
    assert first.json() == {"call": 1, "order_id": 7, "received": ORDER}
    assert first.headers["set-cookie"].startswith("session=session-1")
    assert "idempotent-replayed" not in first.headers
    assert_replay_of(retry, first)
    assert served.state.calls(project.POST_ORDER) == 1
    assert [event.kind for event in served.events.events] == ["claimed", "completed", "replayed"]


def test_requests_without_a_key_or_with_an_uncovered_method_pass_through(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()

    unkeyed = [served.client.post("/orders/7", json=ORDER) for _ in range(2)]
    uncovered = served.client.put("/orders/7", json=ORDER, headers=keyed(new_key()))

    assert [response.json()["call"] for response in unkeyed] == [1, 2]
    assert uncovered.json()["call"] == 3
    assert served.events.events == []


def test_a_duplicate_while_the_first_runs_gets_409_and_the_view_runs_once(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()
    gate = served.state.arm_gate()

    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(served.client.post, "/slow", json=ORDER, headers=keyed(key))
        assert served.state.wait_for_calls(project.POST_SLOW, 1)
        conflict = served.client.post("/slow", json=ORDER, headers=keyed(key))
        gate.set()
        first = running.result(timeout=CLIENT_TIMEOUT_SECONDS)
    after = served.client.post("/slow", json=ORDER, headers=keyed(key))

    assert_problem(conflict, 409, "key-in-progress")
    assert conflict.headers["retry-after"] == "1"
    assert first.status_code == 201
    assert after.headers["idempotent-replayed"] == "true"
    assert after.content == first.content
    assert served.state.calls(project.POST_SLOW) == 1


def test_the_same_key_with_another_body_gets_422(django_servers: DjangoServers) -> None:
    served = django_servers.start()
    key = new_key()

    first = served.post_order(key)
    other = served.client.post("/orders/7", json={**ORDER, "quantity": 3}, headers=keyed(key))

    assert first.status_code == 201
    assert_problem(other, 422, "key-reused")
    assert served.state.calls(project.POST_ORDER) == 1


@pytest.mark.parametrize(
    ("headers", "slug"),
    [
        ([], "missing-key"),
        ([(HEADER, "x" * 256)], "invalid-key"),
        ([(HEADER, "")], "invalid-key"),
        # Two header lines, which the server folds into one with a comma, as WSGI servers do.
        ([(HEADER, "first"), (HEADER, "second")], "invalid-key"),
    ],
    ids=["missing", "too-long", "empty", "sent-twice"],
)
def test_a_missing_or_invalid_key_gets_400_and_the_view_does_not_run(
    django_servers: DjangoServers, headers: list[tuple[str, str]], slug: str
) -> None:
    served = django_servers.start(required=True)

    response = served.client.post("/orders/7", json=ORDER, headers=headers)

    assert_problem(response, 400, slug)
    assert served.state.calls(project.POST_ORDER) == 0


def test_with_problem_base_url_problems_link_their_documentation(
    django_servers: DjangoServers,
) -> None:
    base = "https://api.example.com/problems/"
    served = django_servers.start(required=True, problem_base_url=base)
    key = new_key()
    served.post_order(key)

    missing = served.client.post("/orders/7", json=ORDER)
    reused = served.client.post("/orders/7", json={"other": 1}, headers=keyed(key))

    for response, status, slug in ((missing, 400, "missing-key"), (reused, 422, "key-reused")):
        assert response.status_code == status
        assert response.json()["type"] == base + slug
        assert response.headers["link"] == f'<{base}{slug}>; rel="describedby"'
    assert served.state.calls(project.POST_ORDER) == 1


def test_a_body_over_max_body_bytes_gets_413_before_the_body_is_read(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(max_body_bytes=1000)

    response = served.client.post("/orders", content=b"x" * 1001, headers=keyed(new_key()))

    assert_problem(response, 413, "body-too-large")
    assert "1000 bytes" in response.json()["detail"]
    assert served.state.calls(project.POST_ORDERS) == 0


def test_a_body_over_djangos_data_upload_limit_gets_413_naming_that_limit(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(max_body_bytes=100_000)
    body = b"x" * (project.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)

    response = served.client.post("/orders", content=body, headers=keyed(new_key()))

    assert_problem(response, 413, "body-too-large")
    assert f"{project.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes" in response.json()["detail"]
    assert served.state.calls(project.POST_ORDERS) == 0


def test_a_5xx_response_releases_the_key_and_a_retry_runs_again(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()

    first = served.client.post("/fail?status=503", headers=keyed(key))
    retry = served.client.post("/fail?status=503", headers=keyed(key))

    assert (first.status_code, first.text) == (503, "call 1")
    assert (retry.status_code, retry.text) == (503, "call 2")
    assert "idempotent-replayed" not in retry.headers
    assert [event.kind for event in served.events.events] == ["claimed", "released"] * 2


def test_a_view_that_raises_releases_the_key_and_a_retry_runs_again(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()

    responses = [served.client.post("/boom", headers=keyed(key)) for _ in range(2)]

    # Django turns the exception into its 500 page inside the chain; the key is released.
    assert [response.status_code for response in responses] == [500, 500]
    assert served.state.calls(project.POST_BOOM) == 2
    assert served.events.wait_for("released").status is None


# --- streaming responses -----------------------------------------------------------------------


def test_a_streaming_response_goes_out_live_and_a_retry_gets_410(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()
    gate = served.state.arm_gate()

    with served.client.stream("POST", "/stream", headers=keyed(key)) as response:
        chunks = response.iter_raw()
        first = read_until(chunks, STREAM_FIRST_CHUNK)
        gate.set()  # only now may the view's generator go on to its last chunk
        rest = read_rest(chunks)
    completed = served.events.wait_for("completed")
    retry = served.client.post("/stream", headers=keyed(key))

    assert response.status_code == 200
    assert (first, rest) == (STREAM_FIRST_CHUNK, STREAM_LAST_CHUNK)
    assert completed.status == 200
    assert_problem(retry, 410, "response-not-stored")
    assert f"({len(STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK)} bytes)" in retry.json()["detail"]
    assert served.state.calls(project.POST_STREAM) == 1


def test_a_stream_that_fails_midway_releases_the_key_and_a_retry_runs_again(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()

    with served.client.stream("POST", "/stream?fail=1", headers=keyed(key)) as response:
        received = read_rest(response.iter_raw())
    served.events.wait_for("released")
    with served.client.stream("POST", "/stream", headers=keyed(key)) as retry:
        retry_body = retry.read()

    assert received.startswith(STREAM_FIRST_CHUNK)
    assert STREAM_LAST_CHUNK not in received
    assert "idempotent-replayed" not in retry.headers
    assert retry_body == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert served.state.calls(project.POST_STREAM) == 2


def test_a_file_response_is_streamed_counted_and_not_stored(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start()
    key = new_key()

    first = served.client.post("/file", headers=keyed(key))
    served.events.wait_for("completed")
    retry = served.client.post("/file", headers=keyed(key))

    assert first.content == project.FILE_CONTENT
    assert_problem(retry, 410, "response-not-stored")
    assert f"({len(project.FILE_CONTENT)} bytes)" in retry.json()["detail"]
    assert served.state.calls(project.POST_FILE) == 1


# --- routes, paths and scopes ------------------------------------------------------------------


def test_a_rule_template_covers_a_django_int_path_converter(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(rules=[IdempotencyRule("/orders/{order_id}", required=True)])
    key = new_key()

    unkeyed = served.client.post("/orders/5", json=ORDER)
    other_route = served.client.post("/orders", json=ORDER)
    first = served.post_order(key, order_id=1)
    # One namespace per template: the same key on another order is a reused key.
    other_order = served.post_order(key, order_id=2)

    assert_problem(unkeyed, 400, "missing-key")
    assert other_route.status_code == 201
    assert first.status_code == 201
    assert_problem(other_order, 422, "key-reused")
    assert {event.route for event in served.events.events} == {"/orders/{order_id}"}
    assert served.state.calls(project.POST_ORDER) == 1


def test_rules_match_the_full_path_with_the_script_name_as_the_wsgi_door_does(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(
        prefix="/api", rules=[IdempotencyRule("/api/orders/{order_id}", required=True)]
    )

    unkeyed = served.client.post("/api/orders/3", json=ORDER)
    keyed_response = served.client.post("/api/orders/3", json=ORDER, headers=keyed(new_key()))

    assert_problem(unkeyed, 400, "missing-key")
    assert keyed_response.json()["order_id"] == 3  # Django resolved PATH_INFO, /orders/3
    assert served.events.wait_for("completed").route == "/api/orders/{order_id}"


def test_the_scope_callable_gets_the_request_view_and_separates_its_keys(
    django_servers: DjangoServers,
) -> None:
    seen: list[RequestView] = []

    def by_tenant(view: RequestView) -> str:
        seen.append(view)
        return view.headers.get("x-tenant", "")

    served = django_servers.start(scope=by_tenant, rules=[IdempotencyRule("/orders/{order_id}")])
    key = new_key()

    responses = [
        served.client.post(
            "/orders/9?source=app", json=ORDER, headers={HEADER: key, "X-Tenant": tenant}
        )
        for tenant in ("acme", "globex", "acme")
    ]

    assert [response.json()["call"] for response in responses[:2]] == [1, 2]
    assert_replay_of(responses[2], responses[0])
    view = seen[0]
    assert (view.method, view.path, view.route, view.query) == (
        "POST",
        "/orders/9",
        "/orders/{order_id}",
        "source=app",
    )
    assert view.headers["content-type"] == "application/json"
    assert view.client is not None and view.client[0] == "127.0.0.1"


# --- waiting, store failures and leases --------------------------------------------------------


def test_with_wait_seconds_a_duplicate_waits_for_the_first_and_gets_its_replay(
    django_servers: DjangoServers,
) -> None:
    store = WatchedStore()
    served = django_servers.start(store=store, wait_seconds=5)
    key = new_key()
    gate = served.state.arm_gate()

    with ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.submit(served.client.post, "/slow", json=ORDER, headers=keyed(key))
        assert served.state.wait_for_calls(project.POST_SLOW, 1)
        waiting = pool.submit(served.client.post, "/slow", json=ORDER, headers=keyed(key))
        assert store.wait_for("claim", 2)  # the duplicate found the key held: it waits
        gate.set()
        first = running.result(timeout=CLIENT_TIMEOUT_SECONDS)
        duplicate = waiting.result(timeout=CLIENT_TIMEOUT_SECONDS)

    assert first.status_code == 201
    assert duplicate.headers["idempotent-replayed"] == "true"
    assert duplicate.content == first.content
    assert served.state.calls(project.POST_SLOW) == 1


def test_a_store_failing_on_the_claim_gets_503_and_the_view_does_not_run(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(store=UnreachableStore(), clock=FakeClock())

    response = served.post_order(new_key())

    assert_problem(response, 503, "store-unavailable")
    assert response.headers["retry-after"] == "1"
    assert served.state.calls(project.POST_ORDER) == 0
    assert served.events.wait_for("store_error").operation == "claim"


def test_on_store_error_run_runs_the_view_unprotected(django_servers: DjangoServers) -> None:
    served = django_servers.start(store=UnreachableStore(), on_store_error="run", clock=FakeClock())

    response = served.post_order(new_key())

    assert response.status_code == 201
    assert served.state.calls(project.POST_ORDER) == 1
    assert served.events.wait_for("fail_open").route == "/orders/7"


def test_a_running_views_lease_is_renewed_so_a_duplicate_after_its_lock_gets_409(
    django_servers: DjangoServers,
) -> None:
    clock = FakeClock()
    store = WatchedStore(clock=clock)
    # A 3 s lock is renewed every second (of the fake clock), the renewal thread looking
    # every half second.
    served = django_servers.start(store=store, clock=clock, lock_timeout_seconds=3)
    key = new_key()
    gate = served.state.arm_gate()

    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(served.client.post, "/slow", json=ORDER, headers=keyed(key))
        assert served.state.wait_for_calls(project.POST_SLOW, 1)
        clock.advance(1.5)  # a renewal is due
        assert store.wait_for("renew", 1)
        clock.advance(2)  # past the first lock (3 s), within the renewed one
        duplicate = served.client.post("/slow", json=ORDER, headers=keyed(key))
        gate.set()
        first = running.result(timeout=CLIENT_TIMEOUT_SECONDS)

    assert_problem(duplicate, 409, "key-in-progress")
    assert first.status_code == 201
    assert served.state.calls(project.POST_SLOW) == 1
    assert "taken_over" not in [event.kind for event in served.events.events]


def test_the_dynamodb_store_on_moto(
    django_servers: DjangoServers, moto_endpoint: str, dynamodb_table: str
) -> None:
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        served = django_servers.start(store=store)
        key = new_key()
        first = served.post_order(key)
        retry = served.post_order(key)

    assert first.status_code == 201
    assert_replay_of(retry, first)
    assert served.state.calls(project.POST_ORDER) == 1


# --- Django's ASGI handler, served by uvicorn ---------------------------------------------------


def test_under_djangos_asgi_handler_the_sync_middleware_runs_once_and_replays(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(asgi=True)
    key = new_key()

    first = served.post_order(key)
    retry = served.post_order(key)

    assert first.status_code == 201
    assert first.json()["received"] == ORDER
    assert_replay_of(retry, first)
    assert served.state.calls(project.POST_ORDER) == 1


def test_under_asgi_an_async_stream_completes_the_key_and_a_retry_gets_410(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(asgi=True)
    key = new_key()

    first = served.client.post("/async-stream", headers=keyed(key))
    served.events.wait_for("completed")
    retry = served.client.post("/async-stream", headers=keyed(key))

    assert first.content == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert_problem(retry, 410, "response-not-stored")
    assert served.state.calls(project.POST_ASYNC_STREAM) == 1


def test_under_asgi_an_async_stream_that_fails_releases_the_key(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(asgi=True)
    key = new_key()

    with served.client.stream("POST", "/async-stream?fail=1", headers=keyed(key)) as response:
        received = read_rest(response.iter_raw())
    served.events.wait_for("released")
    retry = served.client.post("/async-stream", headers=keyed(key))

    assert STREAM_LAST_CHUNK not in received
    assert retry.content == STREAM_FIRST_CHUNK + STREAM_LAST_CHUNK
    assert served.state.calls(project.POST_ASYNC_STREAM) == 2


def test_under_asgi_a_chunked_body_over_max_body_bytes_gets_413(
    django_servers: DjangoServers,
) -> None:
    served = django_servers.start(asgi=True, max_body_bytes=1000)
    body = orjson.dumps({"note": "x" * 1500})
    request = served.client.build_request(
        "POST",
        "/orders",
        content=(body[start : start + 100] for start in range(0, len(body), 100)),
        headers=keyed(new_key()),
    )
    assert "content-length" not in request.headers

    response = served.client.send(request)

    assert_problem(response, 413, "body-too-large")
    assert served.state.calls(project.POST_ORDERS) == 0


# --- configuration ---------------------------------------------------------------------------


def test_without_the_setting_the_middleware_is_improperly_configured() -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape('IDEMPOTENCY = {"store": ')):
        WSGIHandler()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"store": AsyncDynamoDBStore("idem", region_name=REGION)},
            re.escape(
                "must be a sync store (DynamoDBStore, RedisStore, PostgresStore, SQLiteStore, "
                "MemoryStore); AsyncDynamoDBStore has no claim"
            ),
        ),
        ({"store": "tests.e2e.test_django.no_such_store"}, "no_such_store"),
        (
            {"store": MemoryStore(), "ttl": 60},
            r"unknown option 'ttl' \(did you mean 'ttl_seconds'\?\)",
        ),
        ({"store": MemoryStore(), "ttl_seconds": -1}, "ttl_seconds"),
        ({"required": True}, "needs the IDEMPOTENCY setting"),
    ],
    ids=["async-store", "bad-path", "unknown-option", "bad-value", "no-store"],
)
def test_a_wrong_setting_fails_at_start_up_naming_the_fix(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        build_handler(WSGIHandler, config)


@pytest.mark.parametrize(
    "store", ["tests.e2e.test_django.make_store", "idempotency_middleware.MemoryStore", MemoryStore]
)
def test_the_store_may_be_a_dotted_path_a_factory_or_a_class(store: object) -> None:
    middleware = our_middleware(build_handler(WSGIHandler, {"store": store}))

    assert type(middleware.store) is MemoryStore
    assert middleware.options.header_name == HEADER
