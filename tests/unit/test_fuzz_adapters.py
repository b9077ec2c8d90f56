"""Hostile input (issue 5): hypothesis drives both adapters in-process.

Keys of any bytes (and repeated, folded, quoted, huge), bodies of any bytes under any content
type (JSON, form, garbage), odd query strings and paths, huge header values, lying
Content-Length headers. The app under the middleware always answers 201, so:

- the middleware itself never answers 500 and never raises;
- one key with the same request never runs the handler twice (the second call replays);
- every response the middleware makes itself is valid ``application/problem+json`` with a
  correct Content-Length, and echoes no client input (key, header values, query, body);
- no response header carries CR or LF;
- a request the rules leave uncovered reaches the app both times, untouched.

Whether a request is covered, and whether it needs a key, is decided by this file's own
model of the documented rules (``expected_coverage``), never by asking the code under test.

Each request is sent twice to a fresh middleware on a ``MemoryStore``.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from idempotency_middleware import (
    IdempotencyMiddleware,
    IdempotencyRule,
    IdempotencyWSGIMiddleware,
    MemoryStore,
    RequestView,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FUZZ_SETTINGS = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Client input shorter than this may appear in a fixed sentence by chance ("a", "the").
MIN_ECHO_CHECK_BYTES = 8


# --- the rules, and the test's own model of what they cover ------------------------------


class ModelRule(NamedTuple):
    """One rule as the README documents it: a route template (literal segments and
    ``{name}`` segments, each matching one non-empty segment), the methods it covers (the
    middleware's when ``None``), ``required`` (the middleware's when ``None``), ``enabled``."""

    template: str
    methods: frozenset[str] | None = None
    required: bool | None = None
    enabled: bool = True


DEFAULT_METHODS = frozenset({"POST", "PATCH"})
MODEL_RULES = (
    # Listed first, so it wins over the template below for this one path.
    ModelRule("/orders/internal", enabled=False),
    ModelRule("/orders/{order_id}", methods=frozenset({"PUT", "PATCH"}), required=False),
    ModelRule("/payments", required=True),
)
RULES = tuple(
    IdempotencyRule(
        rule.template,
        methods=None if rule.methods is None else sorted(rule.methods),
        required=rule.required,
        enabled=rule.enabled,
    )
    for rule in MODEL_RULES
)


def template_matches(template: str, path: str) -> bool:
    template_segments, path_segments = template.split("/"), path.split("/")
    return len(template_segments) == len(path_segments) and all(
        bool(segment) if wanted.startswith("{") else segment == wanted
        for wanted, segment in zip(template_segments, path_segments, strict=True)
    )


class Coverage(NamedTuple):
    covered: bool
    required: bool


def expected_coverage(method: str, path: str, required: bool) -> Coverage:
    """The first rule whose template matches the path decides (methods, enabled, required);
    with none, the middleware's own methods and ``required``."""
    for rule in MODEL_RULES:
        if template_matches(rule.template, path):
            methods = DEFAULT_METHODS if rule.methods is None else rule.methods
            covered = rule.enabled and method in methods
            return Coverage(covered, required if rule.required is None else rule.required)
    return Coverage(method in DEFAULT_METHODS, required)


def tenant_scope(view: RequestView) -> str:
    return view.headers.get("x-tenant") or "anonymous"


# --- strategies -------------------------------------------------------------------------------

VISIBLE = st.binary(min_size=1, max_size=300).map(
    lambda raw: bytes(0x21 + byte % 94 for byte in raw)
)
huge = st.builds(
    lambda unit, times: unit * times, st.binary(min_size=1, max_size=8), st.integers(1000, 12000)
)
key_value = st.one_of(
    st.binary(max_size=300),  # anything at all
    VISIBLE,  # a plausible bare key (may hold , " or \)
    VISIBLE.map(lambda key: b'"' + key + b'"'),  # an RFC 8941 string (may be malformed)
    st.uuids().map(lambda value: str(value).encode()),  # a good key
    huge,
)
good_key = st.one_of(
    st.uuids().map(lambda value: str(value).encode()),
    VISIBLE.filter(lambda key: not any(byte in b',"\\' for byte in key)),
)
# A third of the requests carry one well-formed key, so odd bodies and headers reach the
# store; a third carry none, so the rules' ``required`` is exercised.
key_lines = st.one_of(
    good_key.map(lambda key: [key]), st.just([]), st.lists(key_value, min_size=1, max_size=3)
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
form_body = st.lists(st.tuples(st.binary(max_size=10), st.binary(max_size=10)), max_size=5).map(
    lambda pairs: b"&".join(name + b"=" + value for name, value in pairs)
)
body_and_type = st.one_of(
    st.tuples(
        json_values.map(lambda value: json.dumps(value).encode()), st.just(b"application/json")
    ),
    st.tuples(st.binary(max_size=2000), st.just(b"application/json")),  # broken JSON
    st.tuples(form_body, st.just(b"application/x-www-form-urlencoded")),
    st.tuples(
        st.binary(max_size=2000),
        st.sampled_from(
            [b"text/plain", b"application/octet-stream", b"multipart/form-data; boundary=x", b""]
        )
        | st.binary(max_size=60),
    ),
)
# idempotency-key and content-type here repeat the lines drawn for them.
header_names = st.sampled_from(
    [b"x-tenant", b"content-type", b"idempotency-key", b"x-anything", b"cookie", b"accept"]
) | st.binary(min_size=1, max_size=20).map(lambda raw: bytes(0x61 + byte % 26 for byte in raw))
extra_headers = st.lists(st.tuples(header_names, st.binary(max_size=200) | huge), max_size=4)
content_lengths = st.sampled_from(
    ["exact", "exact", "absent", "garbage", "negative", "huge", "short"]
)
any_text = st.characters(blacklist_categories=["Cs"])
# Near misses of the rules' templates too: "/orders/" + anything, "/payments" + anything.
paths = (
    st.sampled_from(["/orders", "/orders/42", "/orders/internal", "/payments", "/"])
    | st.builds(
        lambda prefix, rest: prefix + rest,
        st.sampled_from(["/orders/", "/orders/internal", "/payments"]),
        st.text(alphabet=any_text, max_size=6),
    )
    | st.text(alphabet=any_text, max_size=40).map(lambda text: "/" + text)
)


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]  # in order, repeated lines kept apart (as ASGI has them)
    body: bytes
    chunk_at: int
    required: bool

    @property
    def keys(self) -> list[bytes]:
        return [value for name, value in self.headers if name == b"idempotency-key"]

    def echo_candidates(self) -> list[bytes]:
        """Client input that must never appear in a problem response."""
        values = [self.query, self.body]
        for _, value in self.headers:
            values += [value, value.strip(b' \t"')]
        return [value.strip() for value in values if len(value.strip()) >= MIN_ECHO_CHECK_BYTES]


@st.composite
def requests(draw: st.DrawFn) -> FuzzRequest:
    body, content_type = draw(body_and_type)
    headers = [(b"host", b"127.0.0.1")]
    headers += [(b"idempotency-key", key) for key in draw(key_lines)]
    if draw(st.booleans()):
        headers.append((b"content-type", content_type))
    declared = draw(content_lengths)
    lengths = {
        "exact": str(len(body)).encode(),
        "garbage": b"12abc",
        "negative": b"-5",
        "huge": b"99999999999",
        "short": str(max(0, len(body) - 1)).encode(),
    }
    if declared in lengths:
        headers.append((b"content-length", lengths[declared]))
    headers += draw(extra_headers)
    return FuzzRequest(
        method=draw(st.sampled_from(["POST", "POST", "PATCH", "PUT", "GET"])),
        path=draw(paths),
        query=draw(st.binary(max_size=200)),
        headers=draw(st.permutations(headers)) if draw(st.booleans()) else headers,
        body=body,
        chunk_at=draw(st.integers(0, 2000)),
        required=draw(st.booleans()),
    )


# --- checks shared by both adapters --------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


@dataclass
class Runs:
    count: int = 0
    bodies: list[bytes] = field(default_factory=list)


def check_answer(answer: Answer, request: FuzzRequest) -> None:
    assert answer.status != 500, answer
    assert answer.status in (201, 400, 409, 413, 422), answer.status
    for name, value in answer.headers:
        assert b"\r" not in name + value and b"\n" not in name + value, (name, value)
    content_type = answer.header(b"content-type")
    if answer.status == 201 and content_type != b"application/problem+json":
        return
    assert content_type == b"application/problem+json", answer
    problem = orjson.loads(answer.body)
    assert isinstance(problem, dict)
    assert set(problem) == {"type", "title", "status", "detail"}
    assert problem["status"] == answer.status
    assert all(isinstance(problem[name], str) for name in ("type", "title", "detail"))
    assert answer.header(b"content-length") == str(len(answer.body)).encode()
    for value in request.echo_candidates():
        assert value.strip() not in answer.body, "a problem response echoed client input"


def check_pair(first: Answer, second: Answer, runs: Runs, request: FuzzRequest) -> None:
    covered, required = expected_coverage(request.method, request.path, request.required)
    event(f"covered={covered} keys={len(request.keys)} statuses={first.status},{second.status}")
    check_answer(first, request)
    check_answer(second, request)
    if not covered:
        # Passed straight through, whatever the key header holds: the app answered twice.
        assert runs.count == 2, "an uncovered request did not reach the app every time"
        assert (first.body, second.body) == tuple(runs.bodies)
        assert second.header(b"idempotent-replayed") is None
        return
    if request.keys:
        assert runs.count <= 1, "one key with the same request ran the handler twice"
    if request.keys and first.status == 201:
        # The first ran (or the key was valid): the second is its replay, byte for byte.
        assert second.status == 201
        assert second.header(b"idempotent-replayed") == b"true"
        assert second.body == first.body
    if not request.keys:
        assert runs.count == (0 if required else 2)


# --- ASGI ---------------------------------------------------------------------------------------


def asgi_app(runs: Runs) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        more = True
        while more:
            message = await receive()
            more = bool(message.get("more_body", False))
        runs.count += 1
        body = orjson.dumps({"run": runs.count})
        runs.bodies.append(body)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


async def call_asgi(app: Any, request: FuzzRequest) -> Answer:
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode("utf-8"),
        "root_path": "",
        "query_string": request.query,
        "headers": list(request.headers),
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    split = min(request.chunk_at, len(request.body))
    chunks = [request.body[:split], request.body[split:]]
    answer = Answer(0, [], b"")

    async def receive() -> Message:
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = list(message.get("headers", []))
        else:
            answer.body += message.get("body", b"")

    await app(scope, receive, send)
    return answer


@FUZZ_SETTINGS
@given(request=requests())
def test_asgi_adapter_survives_hostile_input(request: FuzzRequest) -> None:
    runs = Runs()
    middleware = IdempotencyMiddleware(
        asgi_app(runs),
        store=MemoryStore(),
        required=request.required,
        scope=tenant_scope,
        rules=RULES,
    )

    async def twice() -> tuple[Answer, Answer]:
        return await call_asgi(middleware, request), await call_asgi(middleware, request)

    first, second = asyncio.run(twice())
    check_pair(first, second, runs, request)


# --- WSGI ---------------------------------------------------------------------------------------


def wsgi_app(runs: Runs) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read()
        runs.count += 1
        body = orjson.dumps({"run": runs.count})
        runs.bodies.append(body)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [body]

    return app


def wsgi_path(path: str) -> str:
    # PEP 3333: PATH_INFO is the URL-decoded bytes, each byte as one latin-1 character.
    return path.encode("utf-8").decode("latin-1")


def call_wsgi(app: Any, request: FuzzRequest) -> Answer:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": wsgi_path(request.path),
        "QUERY_STRING": request.query.decode("latin-1"),
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "50000",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in request.headers:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        # WSGI servers fold repeated header lines into one, joined with commas.
        folded = environ.get(key)
        text = value.decode("latin-1")
        environ[key] = text if folded is None else f"{folded}, {text}"
    answer = Answer(0, [], b"")

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer.status = int(status.split(" ", 1)[0])
        answer.headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers
        ]
        return lambda chunk: None

    iterable = app(environ, start_response)
    try:
        answer.body = b"".join(iterable)
    finally:
        close = getattr(iterable, "close", None)
        if close is not None:
            close()
    return answer


@FUZZ_SETTINGS
@given(request=requests())
def test_wsgi_adapter_survives_hostile_input(request: FuzzRequest) -> None:
    runs = Runs()
    middleware = IdempotencyWSGIMiddleware(
        wsgi_app(runs),
        store=MemoryStore(),
        required=request.required,
        scope=tenant_scope,
        rules=RULES,
    )
    first = call_wsgi(middleware, request)
    second = call_wsgi(middleware, request)
    check_pair(first, second, runs, request)
