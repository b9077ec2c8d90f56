"""Fingerprint a request so a reused key with a different payload is caught (422).

Canonical forms make equivalent requests hash alike: JSON key order and insignificant
whitespace do not matter, nor does query or form parameter order. Values always matter.
"""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl, urlencode

import orjson


def _media_type(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


def _sorted_pairs(text: str) -> bytes:
    # surrogateescape keeps distinct invalid percent-escapes distinct (no U+FFFD collisions).
    pairs = sorted(
        parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="surrogateescape")
    )
    return urlencode(pairs, encoding="utf-8", errors="surrogateescape").encode("ascii")


def canonical_query(query_string: bytes | str) -> bytes:
    """Query parameters sorted as pairs (repeated names keep all their values)."""
    text = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
    if not text:
        return b""
    return _sorted_pairs(text)


def canonical_body(content_type: str | None, body: bytes) -> tuple[bytes, bytes]:
    """Return ``(kind, canonical bytes)`` for a body; the kind keeps forms from colliding."""
    media_type = _media_type(content_type)
    if body and _is_json(media_type):
        try:
            # orjson keeps 1 and 1.0 apart and sorts keys; non-JSON falls back to raw bytes.
            return b"json", orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            return b"bytes", body
    if media_type == "application/x-www-form-urlencoded":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return b"bytes", body
        return b"form", _sorted_pairs(text)
    return b"bytes", body


def fingerprint_request(
    method: str,
    path: str,
    query_string: bytes | str,
    content_type: str | None,
    body: bytes,
) -> str:
    """SHA-256 over method, concrete path, sorted query and canonical body (hex)."""
    kind, canonical = canonical_body(content_type, body)
    digest = hashlib.sha256()
    for part in (
        method.encode("ascii", "replace"),
        path.encode("utf-8", "surrogateescape"),
        canonical_query(query_string),
        kind,
        canonical,
    ):
        # Length prefixes make the concatenation unambiguous.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
