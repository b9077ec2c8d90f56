"""Validated middleware options and the per-request policy they resolve to.

Both adapters build one :class:`Options` at construction, so a bad setting fails at start-up
with a ``ValueError`` instead of surprising a request in production.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

from .clock import SYSTEM_CLOCK, Clock
from .events import EventHook
from .rules import (
    IdempotencyRule,
    ScopeFunction,
    check_positive,
    check_reachable,
    normalize_methods,
)

DEFAULT_HEADER_NAME = "Idempotency-Key"
DEFAULT_METHODS = ("POST", "PATCH")
DEFAULT_TTL_SECONDS = 86400
DEFAULT_LOCK_TIMEOUT_SECONDS = 60
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

# A claim is renewed this many times per lock timeout, so one slow or failed renewal still
# leaves time for the next before the lock runs out.
RENEWALS_PER_LOCK = 3

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


class Policy(NamedTuple):
    """What applies to one covered request: its route template and effective settings.

    ``route`` is the matched rule's template, ``None`` when no rule matched (the concrete
    path is the route then). Policies are built once, at construction.
    """

    route: str | None
    required: bool
    ttl_seconds: float
    lock_timeout_seconds: float
    scope: ScopeFunction | None
    renewal_interval: float  # how often a running claim is renewed (see RENEWALS_PER_LOCK)
    wait_seconds: float = 0.0  # how long a duplicate waits for the first attempt's outcome


def _policy(
    route: str | None,
    required: bool,
    ttl_seconds: float,
    lock_timeout_seconds: float,
    scope: ScopeFunction | None,
    wait_seconds: float,
) -> Policy:
    return Policy(
        route,
        required,
        ttl_seconds,
        lock_timeout_seconds,
        scope,
        lock_timeout_seconds / RENEWALS_PER_LOCK,
        wait_seconds,
    )


class MiddlewareOptions(TypedDict, total=False):
    """The keyword options both middlewares take (``**options``); their defaults and
    validation are ``Options.build``'s, the one place they are written."""

    header_name: str
    methods: Iterable[str]
    required: bool
    ttl_seconds: float
    lock_timeout_seconds: float
    rules: Sequence[IdempotencyRule]
    scope: ScopeFunction | None
    max_body_bytes: int
    on_store_error: str
    replay_cache_size: int
    on_event: EventHook | None
    clock: Clock
    wait_seconds: float


@dataclass(frozen=True)
class Options:
    header_name: str
    header_key: bytes  # lower-cased, as ASGI delivers header names
    environ_key: str  # as WSGI delivers it: HTTP_IDEMPOTENCY_KEY
    methods: frozenset[str]
    required: bool
    ttl_seconds: float
    lock_timeout_seconds: float
    rules: tuple[IdempotencyRule, ...]
    scope: ScopeFunction | None
    max_body_bytes: int
    on_store_error: str
    replay_cache_size: int
    on_event: EventHook | None
    clock: Clock
    wait_seconds: float
    default_policy: Policy
    # ((rule, covered methods, policy or None when disabled), ...), first match wins
    rule_policies: tuple[tuple[IdempotencyRule, frozenset[str], Policy | None], ...]

    @classmethod
    def build(
        cls,
        *,
        header_name: str = DEFAULT_HEADER_NAME,
        methods: Iterable[str] = DEFAULT_METHODS,
        required: bool = False,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        lock_timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS,
        rules: Sequence[IdempotencyRule] = (),
        scope: ScopeFunction | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        on_store_error: str = "fail",
        replay_cache_size: int = 0,
        on_event: EventHook | None = None,
        clock: Clock = SYSTEM_CLOCK,
        wait_seconds: float = 0,
    ) -> Options:
        if not isinstance(header_name, str) or not _TOKEN.match(header_name):
            raise ValueError(f"header_name {header_name!r} is not a valid HTTP header name")
        for value, name in (
            (ttl_seconds, "ttl_seconds"),
            (lock_timeout_seconds, "lock_timeout_seconds"),
        ):
            if value is None:
                raise ValueError(f"{name} must be a positive, finite number of seconds, got None")
            check_positive(value, name)
        if (
            isinstance(max_body_bytes, bool)
            or not isinstance(max_body_bytes, int)
            or max_body_bytes <= 0
        ):
            raise ValueError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
        if on_store_error not in ("fail", "run"):
            raise ValueError(f"on_store_error must be 'fail' or 'run', got {on_store_error!r}")
        if (
            isinstance(replay_cache_size, bool)
            or not isinstance(replay_cache_size, int)
            or replay_cache_size < 0
        ):
            raise ValueError(
                f"replay_cache_size must be a non-negative integer, got {replay_cache_size!r}"
            )
        if on_event is not None and not callable(on_event):
            raise ValueError("on_event must be a callable taking an IdempotencyEvent")
        if (
            isinstance(wait_seconds, bool)
            or not isinstance(wait_seconds, (int, float))
            or not 0 <= wait_seconds < math.inf
        ):
            raise ValueError(
                "wait_seconds must be a non-negative, finite number of seconds, "
                f"got {wait_seconds!r}"
            )
        if not isinstance(clock, Clock):
            raise ValueError("clock must have now(), sleep() and asleep() (see clock.Clock)")
        if scope is not None and not callable(scope):
            raise ValueError("scope must be a callable taking a request view")
        rules = tuple(rules)
        for rule in rules:
            if not isinstance(rule, IdempotencyRule):
                raise ValueError(f"rules must hold IdempotencyRule objects, got {rule!r}")
        check_reachable(rules)
        normalized_methods = normalize_methods(methods, "methods")
        default_policy = _policy(
            None, bool(required), ttl_seconds, lock_timeout_seconds, scope, float(wait_seconds)
        )
        rule_policies = tuple(
            (rule, *_rule_policy(rule, normalized_methods, default_policy)) for rule in rules
        )
        return cls(
            header_name=header_name,
            header_key=header_name.lower().encode("ascii"),
            environ_key="HTTP_" + header_name.upper().replace("-", "_"),
            methods=normalized_methods,
            required=bool(required),
            ttl_seconds=ttl_seconds,
            lock_timeout_seconds=lock_timeout_seconds,
            rules=rules,
            scope=scope,
            max_body_bytes=max_body_bytes,
            on_store_error=on_store_error,
            replay_cache_size=replay_cache_size,
            on_event=on_event,
            clock=clock,
            wait_seconds=float(wait_seconds),
            default_policy=default_policy,
            rule_policies=rule_policies,
        )

    def policy_for(self, method: str, path: str) -> Policy | None:
        """The policy for a covered request, or ``None`` when it passes straight through."""
        for rule, methods, policy in self.rule_policies:
            if rule.pattern.match(path) is not None:
                return policy if method in methods else None
        return self.default_policy if method in self.methods else None


def _rule_policy(
    rule: IdempotencyRule, default_methods: frozenset[str], default: Policy
) -> tuple[frozenset[str], Policy | None]:
    """A rule's covered methods and policy, its ``None`` fields taken from the defaults."""
    if not rule.enabled:
        return frozenset(), None
    methods = default_methods if rule.methods is None else frozenset(rule.methods)
    return methods, _policy(
        route=rule.path,
        required=default.required if rule.required is None else rule.required,
        ttl_seconds=default.ttl_seconds if rule.ttl_seconds is None else rule.ttl_seconds,
        lock_timeout_seconds=(
            default.lock_timeout_seconds
            if rule.lock_timeout_seconds is None
            else rule.lock_timeout_seconds
        ),
        scope=default.scope if rule.scope is None else rule.scope,
        wait_seconds=default.wait_seconds,
    )
