"""Command line for operators: ``idempotency-middleware`` / ``python -m idempotency_middleware``.

    create-table   create the DynamoDB table (on-demand, TTL enabled)
    show KEY       print the stored record of a client key, decoded
    delete KEY     delete a record (to re-drive failed work)
    demo           run the demo (needs the [demo] extra)

Exit codes: 0 done, 1 record not found, 2 bad usage, 3 store unreachable or failing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

import orjson

from .keys import InvalidKey, parse_idempotency_key, storage_key
from .records import Record
from .stores.base import StoreUnavailable, SyncOperations
from .stores.dynamodb_sync import DynamoDBStore

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_STORE = 3


class _UsageError(Exception):
    pass


class OperatorStore(SyncOperations, Protocol):
    """What the command line needs of a store: the operator interface, then ``close``."""

    def close(self) -> None: ...


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("store")
    group.add_argument("--table", help="DynamoDB table name")
    group.add_argument("--endpoint-url", help="DynamoDB endpoint (local DynamoDB, moto)")
    group.add_argument("--region", help="AWS region (default: from the AWS configuration)")
    group.add_argument("--sqlite", metavar="PATH", help="use an SQLiteStore database instead")


def _key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", help="the client's Idempotency-Key value (quoted or bare)")
    parser.add_argument("--method", default="POST", help="HTTP method (default: POST)")
    parser.add_argument(
        "--route",
        required=True,
        help="the matched rule's template (/orders/{order_id}) or, without a rule, the path",
    )
    parser.add_argument(
        "--scope",
        default=None,
        help="the scope value your scope callable returned (e.g. 'h:<sha256>' for "
        "scope_by_header), if any",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idempotency-middleware",
        description="Inspect and manage the idempotency store.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    create = commands.add_parser(
        "create-table", help="create the DynamoDB table with on-demand billing and TTL"
    )
    _store_arguments(create)

    show = commands.add_parser("show", help="print the stored record of a key, decoded")
    _key_arguments(show)
    _store_arguments(show)

    delete = commands.add_parser("delete", help="delete the record of a key")
    _key_arguments(delete)
    _store_arguments(delete)

    commands.add_parser("demo", help="run the demo on an embedded local DynamoDB")
    return parser


def _open_store(arguments: argparse.Namespace) -> OperatorStore:
    if arguments.sqlite:
        from .stores.sqlite import SQLiteStore

        return SQLiteStore(arguments.sqlite)
    if not arguments.table:
        raise _UsageError("give --table NAME (DynamoDB) or --sqlite PATH")
    return DynamoDBStore(
        arguments.table, endpoint_url=arguments.endpoint_url, region_name=arguments.region
    )


def _storage_key(arguments: argparse.Namespace) -> str:
    try:
        key = parse_idempotency_key([arguments.key.encode("utf-8", "surrogateescape")])
    except InvalidKey as error:
        raise _UsageError(f"invalid key: {error.detail}") from error
    assert key is not None
    return storage_key(arguments.method.upper(), arguments.route, arguments.scope, key)


def record_as_json(record: Record) -> dict[str, object]:
    """A record as printable JSON: the body as text when it is UTF-8, else as hex.

    Deadlines are the stored epoch seconds, unconverted, as the store compares them.
    """
    described: dict[str, object] = {
        "key_hash": record.key_hash,
        "status": record.status.value,
        "fingerprint": record.fingerprint,
        "lock_expires_at": record.lock_expires_at,
        "expires_at": record.expires_at,
        "response_size": record.response_size,
        "response_not_stored": record.response_not_stored,
    }
    if record.response is not None:
        body = record.response.body
        try:
            text: str | None = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        described["response"] = {
            "status": record.response.status,
            "headers": [
                [name.decode("latin-1"), value.decode("latin-1")]
                for name, value in record.response.headers
            ],
            "body": text if text is not None else None,
            "body_hex": body.hex() if text is None else None,
        }
    return described


def _run(arguments: argparse.Namespace) -> int:
    if arguments.command == "demo":
        try:
            from .demo import main as demo_main
        except ImportError as error:
            print(
                f"the demo needs the [demo] extra: pip install 'idempotency-middleware[demo]' "
                f"({error})",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return demo_main()
    store = _open_store(arguments)
    try:
        if arguments.command == "create-table":
            store.create_table()
            name = arguments.sqlite or arguments.table
            print(f"table {name} ready: partition key 'pk' (S), on-demand billing, TTL on 'ttl'")
            return EXIT_OK
        key = _storage_key(arguments)
        record = store.get(key)
        if record is None:
            print(f"no record for key hash {key}", file=sys.stderr)
            return EXIT_NOT_FOUND
        if arguments.command == "show":
            print(orjson.dumps(record_as_json(record), option=orjson.OPT_INDENT_2).decode())
            return EXIT_OK
        if not store.delete(key):
            # Gone between our read and our delete (released, or another operator).
            print(f"no record for key hash {key}", file=sys.stderr)
            return EXIT_NOT_FOUND
        print(f"deleted record {key} ({record.status.value})")
        return EXIT_OK
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        return _run(arguments)
    except _UsageError as error:
        parser.error(str(error))  # exits with EXIT_USAGE
    except StoreUnavailable as error:
        print(f"store unavailable: {error}", file=sys.stderr)
        return EXIT_STORE
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover - python -m runs __main__.py, not this
    sys.exit(main())
