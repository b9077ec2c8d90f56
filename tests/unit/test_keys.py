"""``parse_idempotency_key`` and ``storage_key``: what a valid key is, and how it is namespaced."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from idempotency_middleware.policy.keys import (
    MAX_KEY_LENGTH,
    QUOTE_IT,
    InvalidKey,
    parse_idempotency_key,
    storage_key,
)

PURE = settings(max_examples=200, deadline=None)

VISIBLE_ASCII = "".join(chr(code) for code in range(0x21, 0x7F))
# An sf-string's characters (RFC 8941: %x20-7E, `"` and `\` escaped): a quoted key's.
PRINTABLE_ASCII = " " + VISIBLE_ASCII
BARE_ALPHABET = "".join(char for char in VISIBLE_ASCII if char not in ',"\\')

bare_keys = st.text(alphabet=BARE_ALPHABET, min_size=1, max_size=MAX_KEY_LENGTH)
any_valid_keys = st.text(alphabet=PRINTABLE_ASCII, min_size=1, max_size=MAX_KEY_LENGTH)


def sf_string(key: str) -> bytes:
    """Serialize ``key`` as an RFC 8941 sf-string (section 4.1.6)."""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'.encode("ascii")


def parse_one(raw: bytes) -> str | None:
    return parse_idempotency_key([raw])


# --- accepted forms ---------------------------------------------------------------------


def test_absent_header_gives_no_key() -> None:
    assert parse_idempotency_key([]) is None


def test_bare_token_is_the_key() -> None:
    assert parse_one(b"8e03978e-40d5-43e8-bc93-6894a57f9324") == (
        "8e03978e-40d5-43e8-bc93-6894a57f9324"
    )


def test_quoted_string_and_bare_token_are_the_same_key() -> None:
    assert parse_one(b'"8e03978e-40d5"') == parse_one(b"8e03978e-40d5") == "8e03978e-40d5"


def test_quoted_string_unescapes_quote_and_backslash() -> None:
    assert parse_one(b'"a\\"b"') == 'a"b'
    assert parse_one(b'"a\\\\b"') == "a\\b"
    assert parse_one(b'"\\\\\\""') == '\\"'


def test_quoted_string_may_carry_a_comma() -> None:
    assert parse_one(b'"a,b"') == "a,b"


def test_surrounding_optional_whitespace_is_ignored() -> None:
    assert parse_one(b" \tabc \t") == "abc"
    assert parse_one(b' "abc" ') == "abc"


def test_key_of_maximum_length_is_accepted() -> None:
    assert parse_one(b"k" * MAX_KEY_LENGTH) == "k" * MAX_KEY_LENGTH
    assert parse_one(sf_string("k" * MAX_KEY_LENGTH)) == "k" * MAX_KEY_LENGTH


def test_length_is_counted_after_unescaping() -> None:
    # 255 escaped quotes are 510 bytes on the wire but a 255-character key.
    assert parse_one(sf_string('"' * MAX_KEY_LENGTH)) == '"' * MAX_KEY_LENGTH


@PURE
@given(bare_keys)
def test_any_bare_token_round_trips(key: str) -> None:
    assert parse_one(key.encode("ascii")) == key


@PURE
@given(any_valid_keys)
def test_any_valid_key_quoted_per_rfc_8941_parses_back(key: str) -> None:
    assert parse_one(sf_string(key)) == key


@PURE
@given(bare_keys)
def test_quoting_a_bare_token_does_not_change_the_key(key: str) -> None:
    assert parse_one(sf_string(key)) == parse_one(key.encode("ascii"))


# --- refused forms ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b'""', id="empty-quoted"),
        pytest.param(b"   ", id="spaces-only"),
        pytest.param(b" \t ", id="whitespace-only"),
    ],
)
def test_empty_key_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidKey):
        parse_one(raw)


def test_key_longer_than_255_characters_is_refused() -> None:
    with pytest.raises(InvalidKey):
        parse_one(b"k" * (MAX_KEY_LENGTH + 1))
    with pytest.raises(InvalidKey):
        parse_one(sf_string("k" * (MAX_KEY_LENGTH + 1)))


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"a\x00b", id="nul"),
        pytest.param(b"a\x01b", id="soh"),
        pytest.param(b"a\tb", id="tab-inside"),
        pytest.param(b"a\nb", id="newline"),
        pytest.param(b"a\x7fb", id="del"),
        pytest.param(b'"a\x01b"', id="quoted-soh"),
        pytest.param(b'"a\tb"', id="quoted-tab"),
        pytest.param(b'"a\x7fb"', id="quoted-del"),
    ],
)
def test_control_characters_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidKey):
        parse_one(raw)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("café".encode(), id="utf8"),
        pytest.param(b"caf\xe9", id="latin1"),
        pytest.param(b"\xff\xfe", id="high-bytes"),
        pytest.param('"café"'.encode(), id="quoted-utf8"),
    ],
)
def test_non_ascii_bytes_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidKey):
        parse_one(raw)


@pytest.mark.parametrize(
    ("raw", "key"),
    [(b'"a b"', "a b"), (b'" ab"', " ab"), (b'"ab "', "ab "), (b'"a \\" b"', 'a " b')],
)
def test_a_quoted_key_may_hold_spaces_kept_as_they_are(raw: bytes, key: str) -> None:
    # The IETF draft's key is an sf-string, whose characters include the space.
    assert parse_one(raw) == key


def test_spaces_inside_quotes_make_another_key_than_without() -> None:
    assert parse_one(b'" abc"') != parse_one(b'"abc"') == parse_one(b"abc")


@pytest.mark.parametrize("raw", [b"a b", b"abc def", b'a"b', b"a\\b", b'abc"', b'a "b"'])
def test_a_bare_key_with_a_space_quote_or_backslash_is_told_to_quote_it(raw: bytes) -> None:
    with pytest.raises(InvalidKey) as raised:
        parse_one(raw)
    assert raised.value.detail == QUOTE_IT
    # The form the message gives is one that parses.
    assert parse_one(b'"abc def"') == "abc def"
    assert '"abc def"' in QUOTE_IT


@pytest.mark.parametrize("raw", [b"a b\x01", "a bé".encode()])
def test_a_bare_key_with_a_space_and_a_character_no_key_may_hold_is_not_told_to_quote_it(
    raw: bytes,
) -> None:
    with pytest.raises(InvalidKey) as raised:
        parse_one(raw)
    assert raised.value.detail != QUOTE_IT


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'"', id="lone-quote"),
        pytest.param(b'"abc', id="unterminated"),
        pytest.param(b'"abc\\"', id="unterminated-after-escape"),
        pytest.param(b'"abc\\', id="backslash-at-end"),
        pytest.param(b'"ab\\c"', id="bad-escape"),
        pytest.param(b'"ab\\n"', id="bad-escape-n"),
        pytest.param(b'"abc"x', id="trailing-garbage"),
        pytest.param(b'"abc" x', id="trailing-token"),
        pytest.param(b'"abc""def"', id="two-strings"),
        pytest.param(b'"abc";p=1', id="parameter"),
        pytest.param(b'"abc"; p="v"', id="parameter-with-space"),
    ],
)
def test_malformed_quoted_string_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidKey):
        parse_one(raw)


def test_header_given_twice_is_refused() -> None:
    with pytest.raises(InvalidKey):
        parse_idempotency_key([b"a", b"b"])
    with pytest.raises(InvalidKey):
        parse_idempotency_key([b"same", b"same"])


@pytest.mark.parametrize(
    "raw",
    [b"a, b", b"a,b", b"a,", b",a", b'"a", "b"', b'"a","b"', b'"a",', b'a, "b"'],
)
def test_comma_folded_values_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidKey):
        parse_one(raw)


@PURE
@given(bare_keys, bare_keys)
def test_any_two_folded_keys_are_refused(first: str, second: str) -> None:
    for raw in (f"{first}, {second}", f'"{first}", "{second}"'):
        with pytest.raises(InvalidKey):
            parse_one(raw.encode("ascii"))


@PURE
@given(st.binary(max_size=300))
def test_parse_never_raises_anything_but_invalid_key(raw: bytes) -> None:
    try:
        key = parse_one(raw)
    except InvalidKey:
        return
    assert key is not None
    assert 1 <= len(key) <= MAX_KEY_LENGTH
    assert all(char in PRINTABLE_ASCII for char in key)


def test_invalid_key_is_a_value_error_with_a_detail() -> None:
    with pytest.raises(ValueError) as raised:
        parse_one(b"")
    assert isinstance(raised.value, InvalidKey)
    assert raised.value.detail


# --- storage_key ------------------------------------------------------------------------


def test_storage_key_is_deterministic() -> None:
    assert storage_key("POST", "/orders", "t1", "k") == storage_key("POST", "/orders", "t1", "k")


def test_storage_key_differs_by_method() -> None:
    assert storage_key("POST", "/orders", None, "k") != storage_key("PATCH", "/orders", None, "k")


def test_storage_key_differs_by_route() -> None:
    assert storage_key("POST", "/orders", None, "k") != storage_key("POST", "/payments", None, "k")


def test_storage_key_differs_by_scope() -> None:
    assert storage_key("POST", "/orders", "t1", "k") != storage_key("POST", "/orders", "t2", "k")
    assert storage_key("POST", "/orders", "t1", "k") != storage_key("POST", "/orders", None, "k")


def test_storage_key_differs_by_key() -> None:
    assert storage_key("POST", "/orders", None, "k1") != storage_key("POST", "/orders", None, "k2")


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("POST", "/ab", "c", "k"), ("POST", "/a", "bc", "k")),
        (("POST", "/r", "ab", "c"), ("POST", "/r", "a", "bc")),
        (("POST", "/r", "", "abc"), ("POST", "/r", "a", "bc")),
        (("POSTX", "/r", "s", "k"), ("POST", "X/r", "s", "k")),
        (("POST", "/r", "s\x00", "k"), ("POST", "/r", "s", "\x00k")),
    ],
)
def test_storage_key_components_do_not_run_into_each_other(
    left: tuple[str, str, str, str], right: tuple[str, str, str, str]
) -> None:
    assert storage_key(*left) != storage_key(*right)


components = st.tuples(
    st.sampled_from(["POST", "PATCH", "PUT", "DELETE"]),
    st.text(max_size=12),
    st.one_of(st.none(), st.text(max_size=12)),
    st.text(min_size=1, max_size=12),
)


@PURE
@given(components, components)
def test_distinct_components_give_distinct_storage_keys(
    left: tuple[str, str, str | None, str], right: tuple[str, str, str | None, str]
) -> None:
    def normalized(parts: tuple[str, str, str | None, str]) -> tuple[str, str, str, str]:
        return (parts[0], parts[1], parts[2] or "", parts[3])

    assume(normalized(left) != normalized(right))
    assert storage_key(*left) != storage_key(*right)


@PURE
@given(any_valid_keys, st.one_of(st.none(), st.text(max_size=20)))
def test_storage_key_never_contains_the_raw_key(key: str, scope: str | None) -> None:
    # A 64-hex-digit digest could contain a short key made only of hex digits by chance.
    assume(any(char not in string.hexdigits.lower() for char in key))
    stored = storage_key("POST", "/orders", scope, key)
    assert key not in stored
    assert len(stored) == 64
    assert all(char in "0123456789abcdef" for char in stored)
