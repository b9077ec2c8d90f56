"""Command line for operators: ``idempotency-middleware`` / ``python -m idempotency_middleware``.

    create-table   create the DynamoDB table (on-demand, TTL enabled), or the PostgreSQL
                   one, or the SQLite file: the only command that creates anything
    show KEY       print the stored record of a client key (or, --function, a function's)
    delete KEY     delete a record (to re-drive failed work); --keys-from FILE: many
    action show ID / action cancel ID   print or cancel a one-time action
    demo           run the demo (needs the [demo] extra)

Exit codes: ``EXIT_CODES_HELP`` below (printed by ``--help``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import Protocol

import orjson

from .. import __version__
from ..policy.keys import InvalidKey, parse_idempotency_key, storage_key
from ..stores.dynamodb import DynamoDBStore
from ..stores.protocol import StoreUnavailable, SyncOperations
from . import functions
from .records import record_as_json

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_MISCONFIGURED = 4
EXIT_REFUSED = 5

EXIT_CODES_HELP = """exit codes:
  0  done
  1  record (or action) not found
  2  bad usage
  3  store unreachable or failing (unreachable, timed out, throttled, server error,
     SQLite locked or I/O error): retry later
  4  store misconfigured (no such table, no region, no or rejected credentials, access
     denied, SQLite file missing or cannot be opened, missing extra): fix what the
     message says
  5  the action cannot be canceled: it was consumed, or it expired
"""


class _UsageError(Exception):
    pass


class OperatorStore(SyncOperations, Protocol):
    """What the command line needs of a store: the operator interface, then ``close``."""

    def close(self) -> None: ...


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("store")
    group.add_argument(
        "--table", help="DynamoDB table name, or the PostgreSQL table (default: idempotency)"
    )
    group.add_argument("--endpoint-url", help="DynamoDB endpoint (local DynamoDB, moto)")
    group.add_argument("--region", help="AWS region (default: from the AWS configuration)")
    group.add_argument("--sqlite", metavar="PATH", help="use an SQLiteStore database instead")
    group.add_argument("--redis", metavar="URL", help="use a RedisStore (redis://host:6379/0)")
    group.add_argument(
        "--prefix", default="idempotency:", help="the RedisStore's key prefix (idempotency:)"
    )
    group.add_argument(
        "--postgres", metavar="DSN", help="use a PostgresStore (postgresql://user@host/db)"
    )


def _key_arguments(parser: argparse.ArgumentParser, *, deletes: bool = False) -> None:
    parser.add_argument(
        "key",
        nargs="?",
        help="the client's Idempotency-Key value (quoted or bare), or a function's key",
    )
    parser.add_argument("--method", default="POST", help="HTTP method (default: POST)")
    parser.add_argument(
        "--route",
        help="the matched rule's template (/orders/{order_id}) or, without a rule, the path",
    )
    parser.add_argument(
        "--scope",
        default=None,
        help="the scope value your scope callable returned (e.g. 'h:<sha256>' for "
        "scope_by_header), if any",
    )
    functions.add_arguments(parser, deletes=deletes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idempotency-middleware",
        description="Inspect and manage the idempotency store.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"idempotency-middleware {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        # A usage error found after parsing (no store given, a bad key) is this
        # subcommand's: its usage is the one worth printing.
        sub.set_defaults(command_parser=sub)
        return sub

    create = command("create-table", "create the DynamoDB table with on-demand billing and TTL")
    _store_arguments(create)

    show = command("show", "print the stored record of a key, decoded")
    _key_arguments(show)
    _store_arguments(show)

    delete = command("delete", "delete the record of a key")
    _key_arguments(delete, deletes=True)
    _store_arguments(delete)

    from ..actions import cli as action_cli

    action_cli.add_commands(
        command("action", "show or cancel a one-time action"), _store_arguments, EXIT_CODES_HELP
    )

    command("demo", "run the demo on moto's DynamoDB server on 127.0.0.1")
    return parser


def _open_store(arguments: argparse.Namespace) -> OperatorStore:
    if arguments.sqlite:
        from ..stores.sqlite import SQLiteStore

        return SQLiteStore(arguments.sqlite)
    if arguments.redis:
        from ..stores.redis import RedisStore

        return RedisStore(arguments.redis, prefix=arguments.prefix)
    if arguments.postgres:
        from ..stores.postgres import PostgresStore

        return PostgresStore(arguments.postgres, table=arguments.table or "idempotency")
    if not arguments.table:
        raise _UsageError(
            "give --table NAME (DynamoDB), --sqlite PATH, --redis URL or --postgres DSN"
        )
    return DynamoDBStore(
        arguments.table, endpoint_url=arguments.endpoint_url, region_name=arguments.region
    )


def _storage_key(arguments: argparse.Namespace) -> str:
    if arguments.route is None:
        raise _UsageError("give --route (an HTTP key) or --function NAME (a function's key)")
    if arguments.key is None:
        raise _UsageError("give the KEY")
    try:
        key = parse_idempotency_key([arguments.key.encode("utf-8", "surrogateescape")])
    except InvalidKey as error:
        raise _UsageError(f"invalid key: {error.detail}") from error
    assert key is not None
    return storage_key(arguments.method.upper(), arguments.route, arguments.scope, key)


# What to do about the misconfigurations that have no message of their own above.
_HINTS = {
    "cannot_open": "check that its directory exists and is writable",
    "access_denied": "check that the file and its directory are writable",
}


def _where(store: DynamoDBStore) -> tuple[str, str]:
    """The region and endpoint a DynamoDB store's client talks to (it exists by now)."""
    meta = store.client.meta
    return str(meta.region_name), str(meta.endpoint_url)


def _create_table_command(arguments: argparse.Namespace, region: str, endpoint: str) -> str:
    command = f"idempotency-middleware create-table --table {arguments.table}"
    if arguments.region:
        command += f" --region {region}"
    if arguments.endpoint_url:
        command += f" --endpoint-url {endpoint}"
    return command


def describe_failure(
    error: StoreUnavailable, store: OperatorStore, arguments: argparse.Namespace
) -> str:
    """What the operator reads: what failed, and what to do about it."""
    cause = error.cause
    dynamodb = store if isinstance(store, DynamoDBStore) else None
    create_table_command = getattr(store, "create_table_command", None)
    if cause == "no_table" and arguments.postgres and callable(create_table_command):
        # (The DSN without its password: PGPASSWORD or ~/.pgpass gives it, as to psql.)
        return f"{error.reason}: create it with `{create_table_command()}`"
    if cause == "no_table" and dynamodb is not None:
        region, endpoint = _where(dynamodb)
        return (
            f"table {arguments.table!r} does not exist in region {region} at {endpoint}: "
            f"create it with `{_create_table_command(arguments, region, endpoint)}`"
        )
    if cause == "no_region":
        return (
            "no AWS region configured: pass --region, or set AWS_REGION (or "
            "AWS_DEFAULT_REGION, or region in the AWS config file)"
        )
    if cause == "no_credentials":
        return (
            f"{error.reason}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
            "or run where an IAM role provides them"
        )
    if cause in ("bad_credentials", "access_denied") and dynamodb is not None:
        region, endpoint = _where(dynamodb)
        return (
            f"{error.reason} for table {arguments.table!r} in region {region} at {endpoint}: "
            "check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE), their permissions on the "
            "table, and the region"
        )
    if error.misconfigured:
        return f"{error.reason}: {_HINTS.get(cause, 'fix the store configuration')}"
    if cause == "unreachable":  # (its reason starts "unreachable: ...")
        option = "--redis" if arguments.redis else "--postgres" if arguments.postgres else None
        return f"store {error.reason}: check {option or '--endpoint-url'} and the network"
    return f"store unavailable: {error.reason}: retry later"


# The commands that may create the store's file or table; every other one only reads or
# deletes, and is refused a store that does not exist rather than making an empty one.
_CREATING_COMMANDS = frozenset({"create-table"})


def _missing_sqlite_file(arguments: argparse.Namespace) -> str | None:
    """Why ``--sqlite PATH`` names no database, for a command that must not create one.

    sqlite3 creates a missing file on connecting, and the store its table: a mistyped path
    would print ``no record`` from a new, empty database instead of saying it is wrong.
    """
    path = arguments.sqlite
    if not path or arguments.command in _CREATING_COMMANDS or os.path.isfile(path):
        return None
    return (
        f"no SQLite database file at {path!r}: check the path (a new database is made by "
        f"`idempotency-middleware create-table --sqlite {shlex.quote(path)}`)"
    )


def _run(arguments: argparse.Namespace) -> int:
    if arguments.command == "demo":
        # The demo package names the missing extra itself (demo.main).
        from ..demo import main as demo_main

        return demo_main(missing_extra=EXIT_MISCONFIGURED)
    # A bad key is a usage error whatever the store: said before the store is opened.
    key = None
    if functions.applies(arguments):
        try:
            functions.check(arguments)
        except functions.FunctionUsageError as error:
            raise _UsageError(str(error)) from None
    elif arguments.command in ("show", "delete"):
        key = _storage_key(arguments)
    missing = _missing_sqlite_file(arguments)
    if missing is not None:
        print(missing, file=sys.stderr)
        return EXIT_MISCONFIGURED
    try:
        store = _open_store(arguments)
    except ModuleNotFoundError as error:
        # A store whose extra is not installed: the message names the pip command.
        print(str(error), file=sys.stderr)
        return EXIT_MISCONFIGURED
    except ValueError as error:
        # A --redis URL or --postgres DSN that is not one (the store says what it expects).
        raise _UsageError(str(error)) from None
    try:
        return _operate(store, arguments, key)
    except StoreUnavailable as error:
        print(describe_failure(error, store, arguments), file=sys.stderr)
        return EXIT_MISCONFIGURED if error.misconfigured else EXIT_STORE
    finally:
        store.close()


def _operate(store: OperatorStore, arguments: argparse.Namespace, key: str | None) -> int:
    if arguments.command == "create-table":
        store.create_table()
        if arguments.sqlite or arguments.redis or arguments.postgres:
            print(f"{store!r} ready")
        else:
            print(
                f"table {arguments.table} ready: partition key 'pk' (S), on-demand billing, "
                "TTL on 'ttl'"
            )
        return EXIT_OK
    if arguments.command == "action":
        from ..actions import cli as action_cli

        return action_cli.run(store, arguments, not_found=EXIT_NOT_FOUND, refused=EXIT_REFUSED)
    if functions.applies(arguments):
        try:
            return functions.operate(store, arguments, print_json, EXIT_NOT_FOUND)
        except functions.FunctionUsageError as error:
            raise _UsageError(str(error)) from None
    assert key is not None  # (show and delete: _run parsed it)
    record = store.get(key)
    if record is None:
        print(f"no record for key hash {key}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if arguments.command == "show":
        print_json(record_as_json(record))
        return EXIT_OK
    if not store.delete(key):
        # Gone between our read and our delete (released, or another operator).
        print(f"no record for key hash {key}", file=sys.stderr)
        return EXIT_NOT_FOUND
    print(f"deleted record {key} ({record.status.value})")
    return EXIT_OK


def print_json(document: dict[str, object]) -> None:
    """Print ``document`` as indented JSON (what ``show`` prints)."""
    print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())


@contextlib.contextmanager
def _pool_log_silenced() -> Iterator[None]:
    """psycopg_pool logs each failed connection attempt itself, from its worker thread
    (``error connecting in 'idempotency-...'``), before the store gives up: the command's
    own message says what failed and what to do, so the pool's line is only noise ahead of
    it. Silenced while the command runs (``main`` may run inside a test's process)."""
    pool_logger = logging.getLogger("psycopg.pool")
    was_disabled = pool_logger.disabled
    pool_logger.disabled = True
    try:
        yield
    finally:
        pool_logger.disabled = was_disabled


def _stop_writing_stdout() -> None:
    """Point standard output at the null device: the reader closed the pipe, and the
    interpreter's own flush at exit would otherwise report the same closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # (not a file descriptor: a test's captured output, nothing left to flush)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); the exit code.

    A reader that stops reading early (``show ... | head``) ends the command quietly with
    status 0, as it ends ``cat``: what was asked was done, only the rest of its output is
    unwanted."""
    try:
        parser = build_parser()
        arguments = parser.parse_args(argv)
        try:
            with _pool_log_silenced():
                code = _run(arguments)
        except _UsageError as error:
            arguments.command_parser.error(str(error))  # exits with EXIT_USAGE
        # Flushed here, so a closed pipe is met inside this try, not at the interpreter's exit.
        sys.stdout.flush()
    except BrokenPipeError:
        _stop_writing_stdout()
        return EXIT_OK
    return code


if __name__ == "__main__":  # pragma: no cover - python -m runs __main__.py, not this
    sys.exit(main())
