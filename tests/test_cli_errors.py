"""The operator command line's less travelled paths: a binary body shown as hex, and a
record that disappears between ``delete``'s read and its delete."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from idempotency_middleware import DynamoDBStore, SQLiteStore
from idempotency_middleware.cli import EXIT_NOT_FOUND, EXIT_OK, main
from idempotency_middleware.keys import storage_key
from idempotency_middleware.records import StoredResponse
from idempotency_middleware.stores.base import Claimed, ClaimRequest, Completion
from idempotency_middleware.testing import FakeClock
from tests.test_store_kit import AnswerRewritingProxy

from .conftest import REGION

BINARY_BODY = b"\x89PNG\r\n\x1a\n\xff\xfe"


def test_show_prints_a_body_that_is_not_utf8_as_hex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "idem.sqlite3"
    hashed = storage_key("POST", "/images", None, "img-1")
    clock = FakeClock()
    store = SQLiteStore(path, clock=clock)
    try:
        assert store.claim(ClaimRequest(hashed, "fp", "owner", clock.now(), 30)) == Claimed()
        response = StoredResponse(201, [(b"content-type", b"image/png")], BINARY_BODY)
        assert store.complete(Completion(hashed, "owner", clock.now(), 3600, response))
    finally:
        store.close()

    code = main(["show", "img-1", "--route", "/images", "--sqlite", str(path)])

    assert code == EXIT_OK
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["key_hash"] == hashed
    assert shown["response"]["body"] is None
    assert shown["response"]["body_hex"] == BINARY_BODY.hex()
    assert shown["response"]["headers"] == [["content-type", "image/png"]]


class DeletedMeanwhileProxy(AnswerRewritingProxy):
    """Sends every DeleteItem to moto twice: the first lands as another operator's delete
    made between the CLI's read and its own delete; the CLI gets the second's answer."""

    def _answer(
        self, operation: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        if operation == "DeleteItem":
            super()._answer(operation, body, headers)
        return super()._answer(operation, body, headers)


@pytest.fixture
def deleting_proxy(moto_endpoint: str) -> Iterator[DeletedMeanwhileProxy]:
    running = DeletedMeanwhileProxy(moto_endpoint)
    with running:
        yield running


def test_delete_reports_not_found_when_the_record_went_between_read_and_delete(
    moto_endpoint: str,
    dynamodb_table: str,
    deleting_proxy: DeletedMeanwhileProxy,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hashed = storage_key("POST", "/orders", None, "order-9")
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        assert store.claim(ClaimRequest(hashed, "fp", "owner", 1_700_000_000.0, 30)) == Claimed()

    code = main(
        [
            "delete",
            "order-9",
            "--route",
            "/orders",
            "--table",
            dynamodb_table,
            "--endpoint-url",
            deleting_proxy.url,
            "--region",
            REGION,
        ]
    )

    assert code == EXIT_NOT_FOUND
    captured = capsys.readouterr()
    assert f"no record for key hash {hashed}" in captured.err
    assert "deleted record" not in captured.out
    # (each DeleteItem is recorded twice: the other operator's and the CLI's own)
    assert deleting_proxy.operations == ["GetItem", "DeleteItem", "DeleteItem"]
    with DynamoDBStore(dynamodb_table, endpoint_url=moto_endpoint, region_name=REGION) as store:
        assert store.get(hashed) is None
