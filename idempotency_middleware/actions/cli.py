"""``idempotency-middleware action show ID`` and ``action cancel ID``: the command line's
one-time action commands (``cli.py`` wires them in, with its store options and exit codes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import orjson

from .errors import ActionError, ActionNotFoundError
from .service import OneTimeActions


def add_commands(
    parser: argparse.ArgumentParser,
    store_arguments: Callable[[argparse.ArgumentParser], None],
    epilog: str,
) -> None:
    """``show`` and ``cancel`` under ``parser`` (the ``action`` command)."""
    commands = parser.add_subparsers(dest="action_command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("show", "print a one-time action as JSON"),
        ("cancel", "cancel a pending or active one-time action, and print it"),
    ):
        sub = commands.add_parser(
            name,
            help=help_text,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument("action_id", help="the action's id")
        store_arguments(sub)
        sub.set_defaults(command_parser=sub)


def run(store: object, arguments: argparse.Namespace, *, not_found: int, refused: int) -> int:
    """Carry out ``action show`` or ``action cancel`` on ``store``; the exit code (0, or
    ``not_found``, or ``refused`` when the action cannot be canceled)."""
    actions = OneTimeActions(store)
    action_id: str = arguments.action_id
    if arguments.action_command == "show":
        action = actions.get(action_id)
        if action is None:
            print("no such action", file=sys.stderr)
            return not_found
    else:
        try:
            action = actions.cancel(action_id)
        except ActionNotFoundError:
            print("no such action", file=sys.stderr)
            return not_found
        except ActionError as error:
            print(f"not canceled: {error}", file=sys.stderr)
            return refused
    print(orjson.dumps(action.to_dict(), option=orjson.OPT_INDENT_2).decode())
    return 0
