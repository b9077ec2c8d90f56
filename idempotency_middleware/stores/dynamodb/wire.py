"""The lean DynamoDB transport's pure parts (h11's idea): what a request carries on the wire
and how its answer reads; ``wire_sync`` and ``wire_async`` only send what this builds.

Why: a botocore or aiobotocore call costs about 1 ms of CPU (User-Agent assembly, parameter
validation, the event system, urllib3 or aiohttp), several times the signing and the JSON it
needs. It mirrors botocore where it matters to callers: the same JSON bodies, SigV4 as
``SigV4Auth`` computes it, standard-mode retries (``wire_retry``), botocore's exceptions and
``error_response``, and responses of the same shape (blobs decoded)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import zlib
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

import orjson

TARGET_PREFIX = "DynamoDB_20120810."
CONTENT_TYPE = "application/x-amz-json-1.0"
USER_AGENT = "idempotency-middleware lean-dynamodb"

# The calls the lean transport carries (the stores' request path): method name -> operation.
OPERATIONS = {
    "put_item": "PutItem",
    "update_item": "UpdateItem",
    "delete_item": "DeleteItem",
    "get_item": "GetItem",
    "transact_write_items": "TransactWriteItems",
}


class Endpoint(NamedTuple):
    url: str
    secure: bool
    host: str
    port: int
    path: str
    host_header: str  # as signed: the port only when it is not the scheme's default
    request_url: str  # what requests are sent to, as botocore's exceptions name it

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint URL: {url!r}")
        default = 443 if secure else 80
        port = parts.port or default
        host = parts.hostname
        bracketed = f"[{host}]" if ":" in host else host
        host_header = bracketed if port == default else f"{bracketed}:{port}"
        path = quote(parts.path or "/", safe="/~")
        return cls(
            url, secure, host, port, path, host_header, f"{parts.scheme}://{parts.netloc}{path}"
        )


class Frozen(NamedTuple):
    """One consistent set of credentials (botocore's ``ReadOnlyCredentials`` has this shape)."""

    access_key: str
    secret_key: str
    token: str | None


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.digest(key, message.encode(), "sha256")


_SIGNED = "content-type;host;x-amz-date;x-amz-target"
_SIGNED_WITH_TOKEN = "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"


class Signer:
    """AWS Signature Version 4 for DynamoDB's POST requests, computed directly. The signing
    key depends only on the secret, the date and the region: it is kept per day (four HMACs
    saved on every request but the day's first)."""

    def __init__(self, endpoint: Endpoint, region: str) -> None:
        self._host = endpoint.host_header
        self._path = endpoint.path
        self._region = region
        self._key: tuple[str, str, bytes] = ("", "", b"")
        # What every request's canonical request and scope share, built once.
        self._canonical_start = f"POST\n{endpoint.path}\n\ncontent-type:{CONTENT_TYPE}\nhost:"
        self._canonical_start += f"{endpoint.host_header}\nx-amz-date:"
        self._scope_end = f"/{region}/dynamodb/aws4_request"
        self._stamp: tuple[int, str] = (-1, "")  # the last second's x-amz-date

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached_secret, cached_day, key = self._key
        if cached_secret != secret or cached_day != day:
            key = _hmac(("AWS4" + secret).encode(), day)
            for part in (self._region, "dynamodb", "aws4_request"):
                key = _hmac(key, part)
            self._key = (secret, day, key)
        return key

    def headers(
        self, target: str, body: bytes, credentials: Frozen, now: float | None = None
    ) -> dict[str, str]:
        """Every header of the request, ``Authorization`` included."""
        second = int(time.time() if now is None else now)
        cached_second, stamp = self._stamp
        if second != cached_second:  # x-amz-date has whole seconds: format it once each
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
            self._stamp = (second, stamp)
        day = stamp[:8]
        token = credentials.token
        security = f"x-amz-security-token:{token}\n" if token else ""
        signed = _SIGNED_WITH_TOKEN if token else _SIGNED
        canonical = (
            f"{self._canonical_start}{stamp}\n{security}x-amz-target:{target}\n\n{signed}\n"
            f"{hashlib.sha256(body).hexdigest()}"
        )
        scope = f"{day}{self._scope_end}"
        to_sign = (
            f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        )
        # hmac.digest: OpenSSL's one-shot HMAC, without hmac.HMAC's Python object.
        signature = hmac.digest(
            self._signing_key(credentials.secret_key, day), to_sign.encode(), "sha256"
        ).hex()
        headers = {
            "Host": self._host,
            "X-Amz-Date": stamp,
            "X-Amz-Target": target,
            "Content-Type": CONTENT_TYPE,
            "Content-Length": str(len(body)),
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",  # as botocore: bodies are read as sent, never gzip
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                f"SignedHeaders={signed}, Signature={signature}"
            ),
        }
        if token:
            headers["X-Amz-Security-Token"] = token
        return headers


def _blob(value: Any) -> str:
    # botocore sends a blob base64-encoded; orjson hands us what it cannot serialize itself.
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot send {type(value).__name__} to DynamoDB: {value!r}")


def encode(params: dict[str, Any]) -> bytes:
    return orjson.dumps(params, default=_blob)


def _decode_value(value: dict[str, Any]) -> None:
    if "B" in value:
        value["B"] = base64.b64decode(value["B"])
    elif "M" in value:
        _decode_item(value["M"])
    elif "L" in value:
        for member in value["L"]:
            if isinstance(member, dict) and not _ENCODED.isdisjoint(member):
                _decode_value(member)
    elif "BS" in value:
        value["BS"] = [base64.b64decode(member) for member in value["BS"]]


# The types whose values hold base64 text (or values that may): only these need a look.
_ENCODED = frozenset(("B", "M", "L", "BS"))


def _decode_item(item: Any) -> None:
    if isinstance(item, dict):
        for value in item.values():
            # One set test per attribute: most are S or N and need nothing.
            if isinstance(value, dict) and not _ENCODED.isdisjoint(value):
                _decode_value(value)


def _decode_blobs(parsed: dict[str, Any]) -> None:
    """Blobs in place, as botocore's parser returns them (bytes, not base64)."""
    for name in ("Attributes", "Item"):
        if name in parsed:
            _decode_item(parsed[name])
    for reason in parsed.get("CancellationReasons") or ():
        if isinstance(reason, dict) and "Item" in reason:
            _decode_item(reason["Item"])


def _metadata(status: int, headers: dict[str, str], attempts: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "HTTPStatusCode": status,
        "HTTPHeaders": headers,
        "RetryAttempts": attempts - 1,
    }
    request_id = headers.get("x-amzn-requestid")
    if request_id is not None:
        metadata["RequestId"] = request_id
    return metadata


# The members botocore parses into ``error.response`` beside ``Error``, per error code of the
# five calls, from DynamoDB's service model (tests/contract/test_dynamodb_wire.py checks this list
# against the model botocore ships).
MODELED_ERROR_MEMBERS: dict[str, tuple[str, ...]] = {
    "ConditionalCheckFailedException": ("message", "Item"),
    "IdempotentParameterMismatchException": ("Message",),
    "InternalServerError": ("message",),
    "ItemCollectionSizeLimitExceededException": ("message",),
    "ProvisionedThroughputExceededException": ("message", "ThrottlingReasons"),
    "ReplicatedWriteConflictException": ("message",),
    "RequestLimitExceeded": ("message", "ThrottlingReasons"),
    "ResourceNotFoundException": ("message",),
    "ThrottlingException": ("message", "throttlingReasons"),
    "TransactionCanceledException": ("Message", "CancellationReasons"),
    "TransactionConflictException": ("message",),
    "TransactionInProgressException": ("Message",),
}


def request_head(request_line: bytes, headers: dict[str, str]) -> bytes:
    return (
        request_line
        + "".join([f"{name}: {value}\r\n" for name, value in headers.items()]).encode()
        + b"\r\n"
    )


def parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    """The status and headers (names lower-cased) of an answer's head, up to the blank line;
    ``EOFError`` for anything but HTTP/1.x. An HTTP/1.0 answer without keep-alive is marked
    ``connection: close``."""
    lines = raw.decode("latin-1").split("\r\n")
    version, status, *_ = lines[0].split(" ", 2)
    if not version.startswith("HTTP/1.") or not status.isdigit():
        raise EOFError(f"not an HTTP/1.x answer: {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers.setdefault("connection", "close")
    return int(status), headers


def keeps_alive(headers: dict[str, str]) -> bool:
    return headers.get("connection", "").lower() != "close"


class Answer(NamedTuple):
    """One HTTP answer: status, headers (names lower-cased) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def checksum_failed(self) -> bool:
        """DynamoDB's ``x-amz-crc32`` disagrees with the body (botocore retries that)."""
        expected = self.headers.get("x-amz-crc32")
        return (
            expected is not None and expected.isdigit() and int(expected) != zlib.crc32(self.body)
        )


def parse_success(answer: Answer, attempts: int) -> dict[str, Any]:
    """The dict botocore returns for a 2xx answer; botocore's ``ResponseParserError``, as its
    parser raises, for a body that is not a JSON object (a proxy's page)."""
    try:
        parsed = orjson.loads(answer.body) if answer.body else {}
    except orjson.JSONDecodeError as error:
        parsed = error
    if not isinstance(parsed, dict):
        from botocore.parsers import ResponseParserError

        raise ResponseParserError(f"not a DynamoDB answer: {answer.body[:200]!r}")
    _decode_blobs(parsed)
    parsed["ResponseMetadata"] = _metadata(answer.status, answer.headers, attempts)
    return parsed


def _error_code(body: dict[str, Any], status: int) -> str:
    code = str(body.get("__type") or status)
    return code.split(":", 1)[0].rsplit("#", 1)[-1]


ErrorBody = tuple[str, dict[str, Any]]  # an error answer's code, and its JSON body


def read_error(answer: Answer) -> ErrorBody:
    """An error answer's ``Error.Code`` (after the ``#`` of ``__type``, else the status) and
    its body, parsed once for the retry decision and what the call then answers."""
    body: dict[str, Any]
    try:
        loaded = orjson.loads(answer.body) if answer.body else {}
        body = loaded if isinstance(loaded, dict) else {}
    except orjson.JSONDecodeError:
        body = {"message": answer.body.decode("utf-8", "replace")}
    return _error_code(body, answer.status), body


def error_code(answer: Answer) -> str:
    """The ``Error.Code`` :func:`error_response` would give."""
    return read_error(answer)[0]


def error_response(answer: Answer, attempts: int, error: ErrorBody | None = None) -> dict[str, Any]:
    """The ``error_response`` botocore's JSON parser builds for a failed call: ``Error``
    (``Code`` after the ``#`` of ``__type``, ``Message``), the modeled members (``Item`` of a
    failed condition, ``CancellationReasons`` of a cancelled transaction) and metadata.
    ``error``: :func:`read_error`'s answer, if read already."""
    code, body = read_error(answer) if error is None else error
    members = MODELED_ERROR_MEMBERS.get(code, ())
    parsed = {name: body[name] for name in members if body.get(name) is not None}
    _decode_blobs(parsed)
    parsed["Error"] = {"Message": body.get("message", body.get("Message", "")), "Code": code}
    parsed["ResponseMetadata"] = _metadata(answer.status, answer.headers, attempts)
    return parsed


CONDITION_FAILED = "ConditionalCheckFailedException"


class Declined(NamedTuple):
    """A conditional write DynamoDB declined (``ConditionalCheckFailedException``), as the
    stores' entry (``WireClient.declining``) answers it instead of raising a ``ClientError``:
    the item ``ReturnValuesOnConditionCheckFailure`` returned (blobs decoded), if any."""

    item: dict[str, Any] | None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Declined:
        item = body.get("Item")
        if not isinstance(item, dict) or not item:
            return cls(None)
        _decode_item(item)
        return cls(item)


def client_error(
    answer: Answer, operation: str, attempts: int, exhausted: bool, error: ErrorBody | None = None
) -> Exception:
    """The ``botocore.exceptions.ClientError`` botocore raises for a failed call."""
    from botocore.exceptions import ClientError

    response = error_response(answer, attempts, error)
    if exhausted:
        response["ResponseMetadata"]["MaxAttemptsReached"] = True
    return ClientError(response, operation)  # type: ignore[no-any-return]
