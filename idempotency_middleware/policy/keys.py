r"""Parse and validate the ``Idempotency-Key`` header, and namespace keys for storage.

The key is an RFC 8941 *sf-string* (``"8e03978e-..."``), as the IETF Idempotency-Key header
draft defines it: printable ASCII (spaces included) between double quotes, with ``"`` and
``\`` escaped as ``\"`` and ``\\``. A bare token (Stripe style: visible ASCII but ``,`` ``"``
``\``) is accepted as the same key: ``"abc"`` and ``abc`` are one key. A key with a space, a
quote or a backslash can only be sent quoted. Anything else is refused before the store is
touched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NoReturn

MAX_KEY_LENGTH = 255

# Visible ASCII (%x21-7E) minus the characters that would make a bare value ambiguous with
# an sf-string or a folded list: `,` (servers fold repeated lines with commas), `"` and `\`.
# bytes.translate deletes the allowed bytes in C; anything left over is refused.
_BARE_ALLOWED = bytes(byte for byte in range(0x21, 0x7F) if byte not in b',"\\')


class InvalidKey(ValueError):
    """The header is present but does not carry one valid key; ``detail`` says why."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def parse_idempotency_key(values: Sequence[bytes]) -> str | None:
    """Return the key carried by the header's raw values, ``None`` if the header is absent.

    ``values`` holds every line of the header as received (ASGI keeps repeated lines apart;
    WSGI servers fold them with ``,``). Raises :class:`InvalidKey` on anything but exactly
    one well-formed key of 1-255 characters once unquoted: visible ASCII, and spaces inside
    a quoted key (kept as they are: ``" abc"`` is not ``"abc"``).
    """
    if not values:
        return None
    if len(values) > 1:
        raise InvalidKey("The idempotency key header was sent more than once.")
    raw = values[0].strip(b" \t")
    if not raw:
        raise InvalidKey("The idempotency key is empty.")
    if raw[:1] == b'"':
        key = _parse_sf_string(raw)
    elif raw.translate(None, _BARE_ALLOWED):
        _refuse_bare(raw)
    else:
        key = raw.decode("ascii")  # a bare token (the usual key): checked in C, one call
    if not key:
        raise InvalidKey("The idempotency key is empty.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"The idempotency key is longer than {MAX_KEY_LENGTH} characters.")
    return key


# What a bare value with a space, a quote or a backslash is told: the form that works.
QUOTE_IT = (
    "The idempotency key has a space, '\"' or '\\': send it as a quoted string, "
    "\"abc def\", with '\"' and '\\' escaped as '\\\"' and '\\\\'."
)


def _refuse_bare(raw: bytes) -> NoReturn:
    """Why a bare value holding bytes outside ``_BARE_ALLOWED`` is no key."""
    if b"," in raw:
        raise InvalidKey("The idempotency key header carries more than one value.")
    if not raw.translate(None, _BARE_ALLOWED + b' "\\'):
        raise InvalidKey(QUOTE_IT)  # (only a space, '"' or '\\' is out of place)
    raise InvalidKey(
        "The idempotency key must be ASCII letters, digits and punctuation (and spaces, "
        "inside a quoted key)."
    )


def _parse_sf_string(raw: bytes) -> str:
    out = bytearray()
    index = 1
    end = len(raw)
    while index < end:
        byte = raw[index]
        if byte == 0x5C:  # backslash: only \" and \\ are legal escapes in RFC 8941
            if index + 1 >= end or raw[index + 1] not in (0x22, 0x5C):
                raise InvalidKey("The idempotency key is a malformed quoted string.")
            out.append(raw[index + 1])
            index += 2
            continue
        if byte == 0x22:
            rest = raw[index + 1 :].strip(b" \t")
            if rest[:1] == b",":
                raise InvalidKey("The idempotency key header carries more than one value.")
            if rest:
                raise InvalidKey("The idempotency key is a malformed quoted string.")
            return out.decode("ascii")  # (every byte was checked to be %x20-7E)
        if byte < 0x20 or byte > 0x7E:  # (RFC 8941's sf-string: %x20-7E)
            raise InvalidKey(
                "The idempotency key must be ASCII letters, digits, punctuation and spaces."
            )
        out.append(byte)
        index += 1
    raise InvalidKey("The idempotency key is a malformed quoted string.")


def storage_key(method: str, route: str, scope: str | None, key: str) -> str:
    """The partition key for one client key: a hash, so nothing a client sent is stored clear.

    Method and route template namespace the key (the same key on ``/orders`` and
    ``/payments`` are two keys); ``scope`` (tenant, API-key hash) keeps clients apart.
    """
    # Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    method_bytes = method.encode("utf-8", "surrogatepass")
    route_bytes = route.encode("utf-8", "surrogatepass")
    scope_bytes = scope.encode("utf-8", "surrogatepass") if scope else b""
    key_bytes = key.encode("utf-8", "surrogatepass")
    framed = b"%d %s%d %s%d %s%d %s" % (
        len(method_bytes),
        method_bytes,
        len(route_bytes),
        route_bytes,
        len(scope_bytes),
        scope_bytes,
        len(key_bytes),
        key_bytes,
    )
    return hashlib.sha256(framed).hexdigest()
