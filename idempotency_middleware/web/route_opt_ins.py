"""Per-route opt-ins: how a framework integration (``web.fastapi``) tells the ASGI door which
routes opted in, without the door importing any framework.

Integrations register when they are imported: an app that never imports one has no route
carrying an opt-in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..policy.rules import IdempotencyRule
from .asgi_messages import ASGIApp

__all__ = ["RouteOptIns", "add_route_opt_ins", "read_route_opt_ins"]


class RouteOptIns(NamedTuple):
    """What a framework integration hands the ASGI door about per-route opt-ins.

    ``read(app)`` turns the routes of the app the middleware wraps into rules (route
    templates and methods, in the router's order; see ``Options.with_route_rules``).
    ``scope_key`` is set in the scope of every request such an opt-in covers, to the
    request's key (``None`` when it had none and passed through), so the route can tell a
    request covered by its own settings from one no middleware applied them to.
    """

    read: Callable[[ASGIApp], Sequence[IdempotencyRule]]
    scope_key: str


_ROUTE_OPT_INS: list[RouteOptIns] = []


def add_route_opt_ins(opt_ins: RouteOptIns) -> None:
    """Register an integration's route opt-ins; every ``IdempotencyMiddleware`` reads them
    from its app at its first scope (registering the same one twice changes nothing)."""
    if opt_ins not in _ROUTE_OPT_INS:
        _ROUTE_OPT_INS.append(opt_ins)


def read_route_opt_ins(app: ASGIApp) -> tuple[list[IdempotencyRule], tuple[str, ...]]:
    """The rules of ``app``'s opted-in routes, read by every registered integration, and
    the scope keys of the integrations that found some. What a reader raises propagates
    (``ValueError``: a route it cannot read)."""
    rules: list[IdempotencyRule] = []
    keys: list[str] = []
    for opt_ins in _ROUTE_OPT_INS:
        read = opt_ins.read(app)
        if read:
            rules.extend(read)
            keys.append(opt_ins.scope_key)
    return rules, tuple(keys)
