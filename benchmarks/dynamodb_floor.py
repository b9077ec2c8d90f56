"""The DynamoDB floor: the least a request can cost on DynamoDB, written directly.

``FloorWSGI`` and ``FloorASGI`` are measurement devices, not middlewares to deploy. Around
the same app as ours they do, inlined, only what a new key and a replay need on DynamoDB:

- a new key: one signed conditional ``PutItem`` (``ReturnValuesOnConditionCheckFailure``
  ``ALL_OLD``) claiming it, the app, then one signed ``UpdateItem`` storing the response,
  fenced by the owner token;
- a replay: the same ``PutItem``, whose failed condition returns the completed item; the
  response is answered from that item (fingerprint checked).

Over one kept-alive connection: a plain blocking socket for WSGI, asyncio streams for
ASGI. The key and the body are hashed as ours hashes them (canonical JSON, SHA-256). No
rules, problem responses, retries, lease renewal, events, redirects or error handling: any
answer off that one path raises ``Unsupported``. Its figure is a lower bound for ours on the
same DynamoDB, which ``benchmarks.dynamodb_requests`` prints beside ours.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import itertools
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import orjson

from idempotency_middleware.stores.records import DROPPED_HEADERS

LOCK_SECONDS = 60
TTL_SECONDS = 86400
_CONTENT_TYPE = "application/x-amz-json-1.0"
_PUT = "DynamoDB_20120810.PutItem"
_UPDATE = "DynamoDB_20120810.UpdateItem"
_CHECK_FAILED = b"ConditionalCheckFailedException"


class Unsupported(Exception):
    """An answer off the floor's one path (ours would handle it; the floor does not)."""


def create_floor_table(client: Any, table_name: str) -> None:
    """The floor's table (a boto3 client: set-up, not the request path)."""
    client.create_table(
        TableName=table_name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=table_name)


class _Wire:
    """SigV4-signed DynamoDB requests as bytes, and their answers parsed: the pure part."""

    def __init__(self, endpoint: str, region: str, table: str) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise Unsupported("the floor speaks plain http only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = self.host if self.port == 80 else f"{self.host}:{self.port}"
        self.region = region
        self.table = table
        self.access_key = os.environ["AWS_ACCESS_KEY_ID"]
        self.secret = os.environ["AWS_SECRET_ACCESS_KEY"]
        self._day = ""
        self._key = b""
        self._owner_prefix = os.urandom(12).hex() + "-"
        self._owners = itertools.count()
        self.calls = 0

    def _signing_key(self, day: str) -> bytes:
        if day != self._day:
            key = hmac.new(("AWS4" + self.secret).encode(), day.encode(), hashlib.sha256).digest()
            for part in (self.region, "dynamodb", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._day, self._key = day, key
        return self._key

    def request(self, target: str, params: dict[str, Any]) -> bytes:
        self.calls += 1
        body = orjson.dumps(params)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        day = stamp[:8]
        canonical = (
            f"POST\n/\n\ncontent-type:{_CONTENT_TYPE}\nhost:{self.host_header}\n"
            f"x-amz-date:{stamp}\nx-amz-target:{target}\n\n"
            f"content-type;host;x-amz-date;x-amz-target\n{hashlib.sha256(body).hexdigest()}"
        )
        scope = f"{day}/{self.region}/dynamodb/aws4_request"
        to_sign = (
            f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        )
        signature = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        head = (
            f"POST / HTTP/1.1\r\nHost: {self.host_header}\r\nContent-Type: {_CONTENT_TYPE}\r\n"
            f"X-Amz-Date: {stamp}\r\nX-Amz-Target: {target}\r\nContent-Length: {len(body)}\r\n"
            f"Authorization: AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature={signature}"
            "\r\n\r\n"
        )
        return head.encode() + body

    @staticmethod
    def content_length(head: bytes) -> tuple[int, int]:
        """(status, body length) of an answer's head (the floor's server always sends a
        Content-Length)."""
        status = int(head[9:12])
        at = head.lower().find(b"\ncontent-length:")
        if at < 0:
            raise Unsupported("an answer without Content-Length")
        end = head.find(b"\r", at + 16)
        return status, int(head[at + 16 : end])

    # --- the two requests and what their answers mean ---

    def claim(self, storage_key: str, fingerprint: str) -> tuple[str, bytes]:
        now = int(time.time())
        owner = f"{self._owner_prefix}{next(self._owners):x}"
        return owner, self.request(
            _PUT,
            {
                "TableName": self.table,
                "Item": {
                    "pk": {"S": storage_key},
                    "fp": {"S": fingerprint},
                    "ow": {"S": owner},
                    "ex": {"N": str(now + LOCK_SECONDS)},
                },
                "ConditionExpression": "attribute_not_exists(pk) OR ex < :now",
                "ExpressionAttributeValues": {":now": {"N": str(now)}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            },
        )

    def complete(
        self,
        storage_key: str,
        owner: str,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> bytes:
        stored = orjson.dumps([[n.decode("latin-1"), v.decode("latin-1")] for n, v in headers])
        return self.request(
            _UPDATE,
            {
                "TableName": self.table,
                "Key": {"pk": {"S": storage_key}},
                "UpdateExpression": "SET st = :st, hd = :hd, bd = :bd, ex = :ex",
                "ConditionExpression": "ow = :ow",
                "ExpressionAttributeValues": {
                    ":st": {"N": str(status)},
                    ":hd": {"S": stored.decode()},
                    ":bd": {"B": base64.b64encode(body).decode()},
                    ":ex": {"N": str(int(time.time()) + TTL_SECONDS)},
                    ":ow": {"S": owner},
                },
            },
        )

    @staticmethod
    def replayed(status: int, answer: bytes, fingerprint: str) -> tuple[int, list[Any], bytes]:
        """The stored response from a failed claim's ``ALL_OLD`` item."""
        if status != 400 or _CHECK_FAILED not in answer:
            raise Unsupported(f"the claim answered {status}: {answer[:200]!r}")
        item = orjson.loads(answer)["Item"]
        if item["fp"]["S"] != fingerprint:
            raise Unsupported("another body under the key (ours answers 422)")
        if "st" not in item:
            raise Unsupported("a key still in progress (ours answers 409)")
        headers = orjson.loads(item["hd"]["S"])
        return int(item["st"]["N"]), headers, base64.b64decode(item["bd"]["B"])


def _closing(head: bytes) -> bool:
    """Whether the server closes the connection after this answer (moto's server speaks
    HTTP/1.0; DynamoDB and DynamoDB Local keep it alive)."""
    return head.startswith(b"HTTP/1.0") or b"connection: close" in head.lower()


def _hashes(method: str, path: str, key: bytes, body: bytes) -> tuple[str, str]:
    """The storage key and fingerprint, framed as ours frames them (no scope, no query)."""
    m, p = method.encode("ascii"), path.encode("utf-8")
    storage_key = hashlib.sha256(b"%d %s%d %s0 %d %s" % (len(m), m, len(p), p, len(key), key))
    canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    fingerprint = hashlib.sha256(
        b"%d %s%d %s0 4 json%d %s" % (len(m), m, len(p), p, len(canonical), canonical)
    )
    return storage_key.hexdigest(), fingerprint.hexdigest()


class FloorWSGI:
    """The floor around a WSGI app, on one blocking socket."""

    def __init__(self, app: Callable[..., Any], endpoint: str, region: str, table: str) -> None:
        self.app = app
        self.wire = _Wire(endpoint, region, table)
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._sock is None:
            self._sock = socket.create_connection((self.wire.host, self.wire.port))
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self._sock
        sock.sendall(request)
        buffer = self._buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            buffer += sock.recv(65536)
        status, length = _Wire.content_length(buffer[: end + 2])
        start = end + 4
        while len(buffer) < start + length:
            buffer += sock.recv(65536)
        self._buffer = buffer[start + length :]
        if _closing(buffer[:end]):
            self.close()
        return status, buffer[start : start + length]

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        key = environ["HTTP_IDEMPOTENCY_KEY"].encode("latin-1")
        body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        storage_key, fingerprint = _hashes(
            environ["REQUEST_METHOD"], environ["PATH_INFO"], key, body
        )
        owner, put = self.wire.claim(storage_key, fingerprint)
        status, answer = self._exchange(put)
        if status != 200:
            code, headers, stored = _Wire.replayed(status, answer, fingerprint)
            start_response(f"{code} Replayed", [(n, v) for n, v in headers])
            return [stored]
        environ["wsgi.input"] = io.BytesIO(body)
        started: list[Any] = []

        def capture(line: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [line, headers]
            return lambda data: None

        result = self.app(environ, capture)
        try:
            response = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        line, headers = started
        code = int(line[:3])
        kept = [(n, v) for n, v in headers if n.lower().encode() not in DROPPED_HEADERS]
        update = self.wire.complete(
            storage_key,
            owner,
            code,
            [(n.encode("latin-1"), v.encode("latin-1")) for n, v in kept],
            response,
        )
        status, answer = self._exchange(update)
        if status != 200:
            raise Unsupported(f"the completion answered {status}: {answer[:200]!r}")
        start_response(line, headers)
        return [response]


class FloorASGI:
    """The floor around an ASGI app, on one asyncio stream pair."""

    def __init__(self, app: Any, endpoint: str, region: str, table: str) -> None:
        self.app = app
        self.wire = _Wire(endpoint, region, table)
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def aclose(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.wire.host, self.wire.port)
        reader, writer = self._streams
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status, length = _Wire.content_length(head)
        answer = await reader.readexactly(length)
        if _closing(head):
            await self.aclose()
        return status, answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        key = next(v for n, v in scope["headers"] if n == b"idempotency-key")
        message = await receive()
        if message.get("more_body", False):
            raise Unsupported("a body in more than one message")
        body: bytes = message.get("body", b"")
        storage_key, fingerprint = _hashes(scope["method"], scope["path"], key, body)
        owner, put = self.wire.claim(storage_key, fingerprint)
        status, answer = await self._exchange(put)
        if status != 200:
            code, headers, stored = _Wire.replayed(status, answer, fingerprint)
            await send(
                {
                    "type": "http.response.start",
                    "status": code,
                    "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
                }
            )
            await send({"type": "http.response.body", "body": stored})
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []
        given = False

        async def replaying() -> Any:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, replaying, capture)
        response = b"".join(chunks)
        headers = [(n, v) for n, v in start.get("headers", []) if n.lower() not in DROPPED_HEADERS]
        update = self.wire.complete(storage_key, owner, start["status"], headers, response)
        status, answer = await self._exchange(update)
        if status != 200:
            raise Unsupported(f"the completion answered {status}: {answer[:200]!r}")
        await send(start)
        await send({"type": "http.response.body", "body": response})
