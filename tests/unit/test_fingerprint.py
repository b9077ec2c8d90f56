"""``fingerprint_request``: equivalent requests hash alike, different requests never do."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from idempotency_middleware.policy import fingerprint
from idempotency_middleware.policy.fingerprint import canonical_query, fingerprint_request

PURE = settings(max_examples=200, deadline=None)

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


def fp(
    body: bytes = b"",
    content_type: str | None = JSON,
    *,
    method: str = "POST",
    path: str = "/orders",
    query: bytes | str = b"",
) -> str:
    return fingerprint_request(method, path, query, content_type, body)


# orjson keeps integers exactly within 64 bits; these are the JSON values a client may send.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


def dumped(value: Any, rng: random.Random) -> bytes:
    """``value`` as JSON text with random key order, indentation and escaping."""
    indent = rng.choice([None, 0, 2, 4, "\t"])
    separators = rng.choice([(",", ":"), (", ", ": "), (" ,  ", " :\n ")])
    text = json.dumps(
        shuffled(value, rng),
        indent=indent,
        separators=separators,
        ensure_ascii=rng.choice([True, False]),
    )
    return (rng.choice(["", " ", "\n", "\r\n\t"]) + text + rng.choice(["", " ", "\n"])).encode()


def canonical_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --- JSON -------------------------------------------------------------------------------


@PURE
@given(json_values, st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_equivalent_json_bodies_have_one_fingerprint(
    value: Any, first: random.Random, second: random.Random
) -> None:
    assert fp(dumped(value, first)) == fp(dumped(value, second))


@PURE
@given(json_values, json_values)
def test_different_json_values_have_different_fingerprints(left: Any, right: Any) -> None:
    assume(canonical_text(left) != canonical_text(right))
    assert fp(json.dumps(left).encode()) != fp(json.dumps(right).encode())


def test_key_order_does_not_matter() -> None:
    assert fp(b'{"a": 1, "b": 2}') == fp(b'{"b": 2, "a": 1}')


def test_insignificant_whitespace_does_not_matter() -> None:
    assert fp(b'{"a":[1,2],"b":{"c":null}}') == fp(
        b'\n{ "a" : [ 1 , 2 ] ,\n\t"b" : { "c" : null } }\n'
    )


def test_nested_object_key_order_does_not_matter() -> None:
    assert fp(b'{"o": {"x": 1, "y": {"p": true, "q": false}}}') == fp(
        b'{"o": {"y": {"q": false, "p": true}, "x": 1}}'
    )


def test_escaped_and_literal_unicode_strings_are_the_same() -> None:
    assert fp('{"name": "café"}'.encode()) == fp(b'{"name": "caf\\u00e9"}')


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(b"1", b"1.0", id="int-vs-float"),
        pytest.param(b"1", b'"1"', id="int-vs-string"),
        pytest.param(b"1.0", b'"1.0"', id="float-vs-string"),
        pytest.param(b"true", b"1", id="true-vs-1"),
        pytest.param(b"false", b"0", id="false-vs-0"),
        pytest.param(b"null", b"false", id="null-vs-false"),
        pytest.param(b'""', b"null", id="empty-string-vs-null"),
        pytest.param(b"[1, 2]", b"[2, 1]", id="list-order"),
        pytest.param(b'{"a": 1}', b'{"a": "1"}', id="value-type"),
        pytest.param(b'{"a": 1}', b'{"A": 1}', id="key-case"),
        pytest.param(b'{"amount": 100}', b'{"amount": 101}', id="amount"),
        pytest.param(b'{"a": {"b": 1}}', b'{"a": {"b": 2}}', id="nested-value"),
        pytest.param(b"[]", b"{}", id="array-vs-object"),
        pytest.param(b'{"a": [1]}', b'{"a": 1}', id="list-vs-scalar"),
    ],
)
def test_different_json_values_are_different_requests(left: bytes, right: bytes) -> None:
    assert fp(left) != fp(right)


def test_integers_beyond_64_bits_keep_their_value() -> None:
    # The handler's own JSON parser (Python's json) sees two different amounts here.
    assert fp(b'{"amount": 18446744073709551616}') != fp(b'{"amount": 18446744073709551617}')
    assert fp(b'{"id": -9223372036854775809}') != fp(b'{"id": -9223372036854775810}')


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.api+json",
        "application/merge-patch+json",
        "application/problem+json; charset=UTF-8",
    ],
)
def test_json_media_types_are_canonicalized(content_type: str) -> None:
    assert fp(b'{"a": 1, "b": 2}', content_type) == fp(b'{"b":2,"a":1}', content_type)


def test_content_type_parameters_are_ignored() -> None:
    body = b'{"a": 1}'
    assert fp(body, "application/json") == fp(body, "application/json; charset=utf-8")
    assert fp(body, "application/json") == fp(body, "application/json ;charset=UTF-8 ")
    assert fp(b"a=1", FORM) == fp(b"a=1", FORM + "; charset=utf-8")


@pytest.mark.parametrize(
    "body",
    [b'{"a": ', b"{'a': 1}", b"not json", b"\xff\xfe\x00", b"[1, 2,]", b"NaN", b"[Infinity]"],
)
def test_invalid_json_with_a_json_content_type_is_hashed_as_bytes(body: bytes) -> None:
    assert fp(body) == fp(body)
    assert fp(body) != fp(body + b" ")


@pytest.mark.parametrize(
    ("body", "equivalent", "different"),
    [
        (b"1e400", b" 1E400 ", b"1e401"),
        (b'{"s": "\\ud800", "t": 1}', b'{"t": 1, "s": "\\ud800"}', b'{"s": "\\ud801", "t": 1}'),
    ],
)
def test_json_beyond_what_orjson_reads_is_still_canonicalized_exactly(
    body: bytes, equivalent: bytes, different: bytes
) -> None:
    # Out-of-range numbers and lone surrogates are valid JSON syntax; orjson refuses them,
    # so they take the exact path and still canonicalize.
    assert fp(body) == fp(equivalent)
    assert fp(body) != fp(different)


def test_empty_body_with_json_content_type_does_not_raise() -> None:
    assert fp(b"") == fp(b"")
    assert fp(b"") != fp(b"{}")


# --- form and other bodies --------------------------------------------------------------


def test_form_body_pair_order_does_not_matter() -> None:
    assert fp(b"a=1&b=2", FORM) == fp(b"b=2&a=1", FORM)


def test_form_body_values_matter() -> None:
    assert fp(b"a=1&b=2", FORM) != fp(b"a=1&b=3", FORM)
    assert fp(b"a=1", FORM) != fp(b"a=1&a=1", FORM)
    assert fp(b"a=", FORM) != fp(b"a=0", FORM)


def test_form_body_encoding_variants_of_one_value_are_the_same() -> None:
    assert fp(b"name=a+b", FORM) == fp(b"name=a%20b", FORM)


def test_invalid_utf8_form_body_is_hashed_without_raising() -> None:
    assert fp(b"a=\xff", FORM) != fp(b"a=\xfe", FORM)


@pytest.mark.parametrize("content_type", [None, "", "text/plain", "application/octet-stream"])
def test_other_bodies_are_hashed_as_bytes(content_type: str | None) -> None:
    assert fp(b"a=1&b=2", content_type) != fp(b"b=2&a=1", content_type)
    assert fp(b'{"a":1,"b":2}', content_type) != fp(b'{"b":2,"a":1}', content_type)
    assert fp(b"x", content_type) == fp(b"x", content_type)


@PURE
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_different_byte_bodies_have_different_fingerprints(left: bytes, right: bytes) -> None:
    assume(left != right)
    assert fp(left, "application/octet-stream") != fp(right, "application/octet-stream")


# --- method, path, query ----------------------------------------------------------------


def test_method_matters() -> None:
    assert fp(b"{}", method="POST") != fp(b"{}", method="PATCH")


def test_path_matters() -> None:
    assert fp(b"{}", path="/orders/1/refunds") != fp(b"{}", path="/orders/2/refunds")


def test_body_matters() -> None:
    assert fp(b'{"a": 1}') != fp(b'{"a": 2}')


def test_query_parameter_order_does_not_matter() -> None:
    assert fp(query=b"a=1&b=2") == fp(query=b"b=2&a=1")
    assert fp(query="a=1&b=2") == fp(query=b"b=2&a=1")


def test_query_values_matter() -> None:
    assert fp(query=b"a=1") != fp(query=b"a=2")
    assert fp(query=b"") != fp(query=b"a=1")
    assert fp(query=b"a=1") != fp(query=b"a=1&a=1")


def test_components_do_not_run_into_each_other() -> None:
    assert fp(b"", path="/a", query=b"b=1") != fp(b"", path="/ab", query=b"=1")
    assert fp(b"x=1", "text/plain", query=b"") != fp(b"", "text/plain", query=b"x=1")


@PURE
@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=5), st.text(max_size=5)),
        max_size=6,
    ),
    st.randoms(use_true_random=False),
)
def test_any_query_in_any_order_has_one_canonical_form(
    pairs: list[tuple[str, str]], rng: random.Random
) -> None:
    from urllib.parse import urlencode

    reordered = list(pairs)
    rng.shuffle(reordered)
    assert canonical_query(urlencode(pairs)) == canonical_query(urlencode(reordered))


# --- One fingerprint whatever the path ---------------------------------------------------

# JSON text with numbers of every shape: integers past 64 bits, -0, 1 vs 1.0, exponents in
# and far out of a double's range (with leading zeros, either case, either sign), more
# significant digits than a double holds; strings escaped or not; duplicate keys.
_FIXED_NUMBERS = (
    "-0", "0", "-0.0", "0.0", "1", "1.0", "1e0", "1E+0", "1e-400", "0e-400", "-0e400",
    "1e308", "1.7976931348623157e308", "4.9e-324", "2.2250738585072014e-308", "1.234567e-320",
)  # fmt: skip
_digits = st.text("0123456789", min_size=1, max_size=22)


@st.composite
def _number_texts(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["int", "decimal", "float", "exponent", "fixed"]))
    if shape == "int":
        return str(draw(st.integers(min_value=-(10**30), max_value=10**30)))
    if shape == "float":
        return repr(draw(st.floats(allow_nan=False, allow_infinity=False)))
    if shape == "fixed":
        return draw(st.sampled_from(_FIXED_NUMBERS))
    sign = draw(st.sampled_from(["", "-"]))
    whole = draw(_digits).lstrip("0") or "0"
    number = sign + whole
    if shape == "decimal" or draw(st.booleans()):
        number += "." + draw(_digits)
    if shape == "exponent":
        exponent = draw(st.integers(min_value=0, max_value=450))
        number += draw(st.sampled_from(["e", "E"])) + draw(st.sampled_from(["", "+", "-"]))
        number += "0" * draw(st.integers(min_value=0, max_value=2)) + str(exponent)
    return number


def _string_text(text: str, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)


json_texts = st.recursive(
    _number_texts()
    | st.sampled_from(["true", "false", "null"])
    | st.builds(_string_text, st.text(max_size=6), st.booleans()),
    lambda children: (
        st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
        | st.lists(
            st.tuples(st.sampled_from(["a", "b", "\\u0061", "é", "😀"]), children), max_size=4
        ).map(lambda pairs: "{" + ",".join(f'"{key}" :{value}' for key, value in pairs) + "}")
    ),
    max_leaves=12,
)


@settings(max_examples=1000, deadline=None)
@given(json_texts)
def test_the_fast_and_the_exact_paths_always_agree(text: str) -> None:
    body = text.encode()
    fast = fingerprint._fast_canonical_json(body)
    exact = fingerprint._exact_canonical_json(body)
    assert exact is not None  # valid JSON always canonicalizes
    if fast is not None:
        assert fast == exact


@pytest.mark.parametrize("pad", [b"", b', "pad": 1234567890123456'])
def test_a_number_past_a_double_never_collapses_onto_its_neighbour(pad: bytes) -> None:
    # Whether or not the rest of the body sends it down the exact path.
    assert fp(b'{"a": 1e-400' + pad + b"}") != fp(b'{"a": 0.0' + pad + b"}")
    assert fp(b'{"a": 1.234567e-320' + pad + b"}") != fp(b'{"a": 1.2347e-320' + pad + b"}")
    assert fp(b'{"a": 1e400' + pad + b"}") == fp(b'{"a": 10e399' + pad + b"}")


@pytest.mark.parametrize(
    ("left", "right", "same"),
    [
        pytest.param(b'{"a": 1, "a": 2}', b'{"a": 2}', True, id="duplicate-keys-last-wins"),
        pytest.param(b"1", b"1.0", False, id="int-vs-float"),
        pytest.param(b"-0", b"0", True, id="integer-minus-zero"),
        pytest.param(b"-0.0", b"0.0", False, id="float-minus-zero"),
        pytest.param(b"1e2", b"100.0", True, id="exponent-form"),
        pytest.param(b"1.0", b"10e-1", True, id="one-number-two-forms"),
        pytest.param(b"0.1000000000000000000001", b"0.1", False, id="past-a-double"),
        pytest.param(
            b"123456789012345678901234567890",
            b"1.2345678901234568e29",
            False,
            id="big-int-vs-float",
        ),
        pytest.param(b'"\\u0041"', b'"A"', True, id="string-escapes"),
        pytest.param(b'{"a":1,"b":2}', b'{ "b" : 2 , "a" : 1 }', True, id="order-whitespace"),
        pytest.param(b"\xef\xbb\xbf{}", b"{}", True, id="byte-order-mark-ignored"),
    ],
)
def test_what_is_and_is_not_the_same_json_body(left: bytes, right: bytes, same: bool) -> None:
    assert (fp(left) == fp(right)) is same
