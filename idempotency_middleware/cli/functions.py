"""The command line's reach into function and consumer keys: ``--function NAME``,
``--consumer NAME``.

``show KEY --function NAME`` and ``delete KEY --function NAME`` address the key of an
``idempotent`` function named ``NAME`` (its ``name=``, else ``module.qualname``),
``--consumer NAME`` the same key of an ``IdempotentConsumer``: ``show`` prints a function's
result, and for a consumer also the verdict a redelivery gets (``records.py``);
``delete --function NAME --keys-from FILE`` deletes one key a line (``-``: standard input),
for a dead-letter redrive, and prints how many it deleted.

A function's key is taken as it is (the string the key callable returned), not parsed as an
``Idempotency-Key`` header.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

from ..functions.attempts import function_key_hash
from ..stores.protocol import SyncOperations
from .records import consumer_record_as_json, function_record_as_json


class FunctionUsageError(Exception):
    """A combination of options that addresses no key (the command line's usage error)."""


def add_arguments(parser: argparse.ArgumentParser, *, deletes: bool) -> None:
    """``--function`` (and, for ``delete``, ``--keys-from``) on a key command's parser."""
    parser.add_argument(
        "--function",
        metavar="NAME",
        help="address the key of an idempotent function with this name (its name=, else "
        "module.qualname) instead of an HTTP route",
    )
    parser.add_argument(
        "--consumer",
        metavar="NAME",
        help="address the key of an IdempotentConsumer with this name, as --function does"
        + ("" if deletes else "; show prints the verdict a redelivery of the message gets"),
    )
    if deletes:
        parser.add_argument(
            "--keys-from",
            metavar="FILE",
            help="with --function or --consumer: delete every key in FILE, one a line "
            "('-': standard input), and print how many were deleted",
        )


def applies(arguments: argparse.Namespace) -> bool:
    """Whether the command addresses function keys (``--function``, ``--consumer`` or
    ``--keys-from``)."""
    return any(getattr(arguments, name, None) for name in ("function", "consumer", "keys_from"))


def _name(arguments: argparse.Namespace) -> str:
    name: str = arguments.function or arguments.consumer
    return name


def check(arguments: argparse.Namespace) -> None:
    """``FunctionUsageError`` for options that do not go together."""
    keys_from = getattr(arguments, "keys_from", None)
    if arguments.function and arguments.consumer:
        raise FunctionUsageError("give --function NAME or --consumer NAME, not both")
    if not arguments.function and not arguments.consumer:
        raise FunctionUsageError("--keys-from needs --function NAME (or --consumer NAME)")
    if arguments.route is not None or arguments.scope is not None:
        raise FunctionUsageError(
            "--function addresses a function's or consumer's keys: drop --route and --scope"
        )
    if keys_from and arguments.key is not None:
        raise FunctionUsageError("give a KEY or --keys-from FILE, not both")
    if not keys_from and not arguments.key:
        raise FunctionUsageError("give the KEY (or, with delete, --keys-from FILE)")


def _keys(source: TextIO) -> Iterator[str]:
    for line in source:
        key = line.rstrip("\r\n")
        if key:  # (blank lines, a trailing one included, name no key)
            yield key


def operate(
    store: SyncOperations,
    arguments: argparse.Namespace,
    show: Callable[[dict[str, object]], None],
    not_found: int,
) -> int:
    """Run ``show``/``delete`` on function keys; the exit code. ``show`` prints a record's
    JSON document."""
    check(arguments)
    name = _name(arguments)
    if getattr(arguments, "keys_from", None):
        return _delete_many(store, name, arguments.keys_from)
    key_hash = function_key_hash(name, arguments.key)
    record = store.get(key_hash)
    if record is None:
        print(f"no record for key {arguments.key!r} of {name} (hash {key_hash})", file=sys.stderr)
        return not_found
    if arguments.command == "show":
        describe = consumer_record_as_json if arguments.consumer else function_record_as_json
        show(describe(record, name, arguments.key))
        return 0
    if not store.delete(key_hash):
        print(f"no record for key {arguments.key!r} of {name} (hash {key_hash})", file=sys.stderr)
        return not_found
    print(f"deleted record {key_hash} ({record.status.value})")
    return 0


def _delete_many(store: SyncOperations, name: str, path: str) -> int:
    try:
        source = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as error:
        raise FunctionUsageError(f"cannot read --keys-from {path}: {error.strerror}") from error
    deleted = total = 0
    try:
        for key in _keys(source):
            total += 1
            deleted += store.delete(function_key_hash(name, key))
    finally:
        if source is not sys.stdin:
            source.close()
    # Keys with no record were already gone (never run, released, or expired): a redrive
    # runs them either way.
    print(f"deleted {deleted} of {total} keys of {name}")
    return 0


__all__ = ["FunctionUsageError", "add_arguments", "applies", "check", "operate"]
