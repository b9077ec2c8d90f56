"""Fingerprint a request so a reused key with a different payload is caught (422).

Canonical forms make equivalent requests hash alike: JSON key order and insignificant
whitespace do not matter, nor does query or form parameter order. Values always matter.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson

# orjson reads numbers into 64-bit ints and doubles: integers past 64 bits and decimals with
# more significant digits than a double holds would collapse onto their neighbours. A body
# with a run of 16+ digits (or dots) may hold one, so it takes the exact (slower) path.
# (translate maps digits and dots to "0" in C; faster than a regex search.)
# The same table folds exponent marks and signs (E to e, + to -) so an exponent of 3 digits
# or more (leading zeros included) reads "e000" or "e-000": the only way a number with
# fewer than 16 digits leaves a double's range (or is rounded as a subnormal).
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789.E+", b"0" * 11 + b"e-")
_LONG_NUMBER = b"0" * 16
# (A regex: a substring search for "e000" is several times slower on digit-heavy text.)
_BIG_EXPONENT = re.compile(rb"e-?000")


@functools.lru_cache(maxsize=256)
def _body_kind(content_type: bytes | str | None) -> bytes:
    """``json``, ``form`` or ``bytes`` for a Content-Type value (parameters ignored), raw as
    ASGI gives it or decoded as WSGI does.

    Cached: an API sees a handful of distinct Content-Type values.
    """
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return b"json"
    if media_type == "application/x-www-form-urlencoded":
        return b"form"
    return b"bytes"


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


def canonical_body(content_type: bytes | str | None, body: bytes) -> tuple[bytes, bytes]:
    """Return ``(kind, canonical bytes)`` for a body; the kind keeps forms from colliding."""
    return _canonical(_body_kind(content_type), body)


def _canonical(kind: bytes, body: bytes) -> tuple[bytes, bytes]:
    if body and kind == b"json":
        fast = _fast_canonical_json(body)
        if fast is not None:
            return kind, fast
        exact = _exact_canonical_json(body)
        return (kind, exact) if exact is not None else (b"bytes", body)
    if kind == b"form":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return b"bytes", body
        return b"form", _sorted_pairs(text)
    return b"bytes", body


def _fast_canonical_json(body: bytes) -> bytes | None:
    """Canonical JSON through orjson, or ``None`` when orjson cannot give it exactly."""
    folded = body.translate(_DIGITS_TO_ZERO)
    if _LONG_NUMBER in folded:
        return None
    try:
        # orjson keeps 1 and 1.0 apart and sorts keys.
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    # A number below a double's range silently becomes 0.0, -0.0 or a subnormal (printed
    # with an exponent of -308 or below) where the exact path keeps it: 1e-400 is not 0.0.
    # With no run of 16 digits, only an exponent of 3 digits reaches there. (An ordinary
    # body fails the first check, two substring searches, so the regex engine runs on
    # almost no request; "e123" inside a string fails the second. A false alarm only costs
    # the exact path.)
    if (b"0.0" in canonical or b"e-3" in canonical) and _BIG_EXPONENT.search(folded) is not None:
        return None
    return canonical


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _exact_canonical_json(body: bytes) -> bytes | None:
    """Canonical JSON keeping every number exactly (``None`` when the body is not JSON)."""
    try:
        value = json.loads(body, parse_float=Decimal, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    out: list[bytes] = []
    try:
        _write_canonical(value, out)
    except RecursionError:
        return None
    return b"".join(out)


def _write_canonical(value: Any, out: list[bytes]) -> None:
    # Same output as the orjson path for every number a double or a 64-bit int holds, so
    # the path taken never changes a fingerprint; other numbers keep their exact value.
    if isinstance(value, dict):
        out.append(b"{")
        for index, name in enumerate(sorted(value)):
            if index:
                out.append(b",")
            out.append(orjson.dumps(name))
            out.append(b":")
            _write_canonical(value[name], out)
        out.append(b"}")
    elif isinstance(value, list):
        out.append(b"[")
        for index, item in enumerate(value):
            if index:
                out.append(b",")
            _write_canonical(item, out)
        out.append(b"]")
    elif isinstance(value, Decimal):
        nearest = float(value)
        if Decimal(repr(nearest)) == value:
            out.append(orjson.dumps(nearest))
        else:
            out.append(_exact_number(value))
    elif isinstance(value, int) and not isinstance(value, bool):
        out.append(str(value).encode("ascii"))
    else:  # str, bool, None
        try:
            out.append(orjson.dumps(value))
        except TypeError:  # a lone surrogate from a \ud800 escape: keep it escaped
            out.append(b"~" + json.dumps(value).encode("ascii"))


def _exact_number(value: Decimal) -> bytes:
    """A number no double holds, by its exact value: ``1e400`` and ``10e399`` are one
    number (``~1e400``); the ``~`` keeps it apart from any double's form."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite: JSON has no NaN or Infinity
    text = "".join(map(str, digits))
    significant = text.rstrip("0")  # never empty: every zero is a double
    exponent += len(text) - len(significant)
    return b"~%s%se%d" % (b"-" if sign else b"", significant.encode("ascii"), exponent)


def fingerprint_request(
    method: str,
    path: str,
    query_string: bytes | str,
    content_type: bytes | str | None,
    body: bytes,
) -> str:
    """SHA-256 over method, concrete path, sorted query and canonical body (hex)."""
    kind, canonical = _canonical(_body_kind(content_type), body)
    method_bytes = method.encode("ascii", "replace")
    path_bytes = path.encode("utf-8", "surrogateescape")
    query = canonical_query(query_string) if query_string else b""
    # Length prefixes make the concatenation unambiguous.
    framed = b"%d %s%d %s%d %s%d %s%d %s" % (
        len(method_bytes),
        method_bytes,
        len(path_bytes),
        path_bytes,
        len(query),
        query,
        len(kind),
        kind,
        len(canonical),
        canonical,
    )
    return hashlib.sha256(framed).hexdigest()
