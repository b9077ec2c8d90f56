"""Validated middleware options and the per-request policy they resolve to.

Both adapters build one :class:`Options` at construction, so a bad setting fails at start-up
with a ``ValueError`` instead of surprising a request in production.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict, TypeVar
from urllib.parse import urlsplit

from ..clock import DEFAULT_CLOCK_SKEW_SECONDS as DEFAULT_CLOCK_SKEW_SECONDS
from ..clock import SYSTEM_CLOCK, Clock
from ..events import EventHook, OnEvent, one_hook
from ..stores.encryption import Encryption, check_encryption
from .rules import (
    IdempotencyRule,
    ScopeFunction,
    check_non_negative,
    check_positive,
    check_reachable,
    normalize_methods,
)

DEFAULT_HEADER_NAME = "Idempotency-Key"
DEFAULT_METHODS = ("POST", "PATCH")
DEFAULT_TTL_SECONDS = 86400
DEFAULT_LOCK_TIMEOUT_SECONDS = 60
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# The statuses whose responses are the outcome of a request, kept and replayed: below 500
# (a 5xx is the server's failure, released so a retry runs again).
DEFAULT_STORED_STATUSES: frozenset[int] = frozenset(range(100, 500))

# A claim is renewed this many times per lock timeout, so one slow or failed renewal still
# leaves time for the next before the lock runs out.
RENEWALS_PER_LOCK = 3

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# The characters RFC 3986 allows in a URI (unreserved, reserved and "%"): what a problem
# base URL may hold, so it goes into a JSON string and a Link header's <...> as it is.
_URI_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+\Z")


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
    # A route opt-in's (Options.with_route_rules): the ASGI door marks its requests in their
    # scope for the route (route_opt_ins.RouteOptIns.scope_key).
    route_opt_in: bool = False
    # The takeover margin a claim carries (ClaimRequest.clock_skew_seconds).
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS


# Route opt-ins, looked up before the rules: ((rule, its methods, policy), ...), where a
# rule is a route's own template and methods and the policy None for a route without an
# opt-in (see Options.with_route_rules).
RoutePolicies = tuple[tuple[IdempotencyRule, frozenset[str], Policy | None], ...]


def _policy(
    route: str | None,
    required: bool,
    ttl_seconds: float,
    lock_timeout_seconds: float,
    scope: ScopeFunction | None,
    wait_seconds: float,
    clock_skew_seconds: float,
) -> Policy:
    return Policy(
        route,
        required,
        ttl_seconds,
        lock_timeout_seconds,
        scope,
        lock_timeout_seconds / RENEWALS_PER_LOCK,
        wait_seconds,
        clock_skew_seconds=clock_skew_seconds,
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
    on_event: OnEvent
    clock: Clock
    wait_seconds: float
    problem_base_url: str | None
    clock_skew_seconds: float
    check_store: bool
    stored_statuses: Iterable[int]
    encryption: Encryption | None


# What a middleware takes by keyword: its store and its options.
DOOR_OPTIONS = frozenset({"store", *MiddlewareOptions.__optional_keys__})
F = TypeVar("F", bound=Callable[..., Any])


def check_option_names(door: str, given: Iterable[str], valid: Collection[str]) -> None:
    """``TypeError`` naming each of ``given`` that ``door`` does not take, the valid name
    it is closest to, and every valid name: a misspelled option fails where it is written."""
    unknown = [name for name in given if name not in valid]
    if not unknown:
        return
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.4)
        named.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(
        f"{door} got unknown option{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
        f"its options are {', '.join(sorted(valid))}"
    )


def named_options(door: str) -> Callable[[F], F]:
    """Decorate a function of keyword options so a misspelled one is answered by
    :func:`check_option_names` rather than Python's bare "unexpected keyword argument"."""

    def decorate(function: F) -> F:
        parameters = inspect.signature(function).parameters.values()
        # (What a caller can pass by name: a method's self is not one of its options.)
        valid = frozenset(
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        )

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            check_option_names(door, kwargs, valid)
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


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
    # The hooks given, as one callable (several: an ``events.Hooks``).
    on_event: EventHook | None
    clock: Clock
    wait_seconds: float
    problem_base_url: str | None  # problem types are base + slug; None: URNs
    check_store: bool  # the door checks its store at start-up
    default_policy: Policy
    # ((rule, covered methods, policy or None when disabled), ...), first match wins
    rule_policies: tuple[tuple[IdempotencyRule, frozenset[str], Policy | None], ...]
    route_policies: RoutePolicies = ()
    stored_statuses: frozenset[int] = DEFAULT_STORED_STATUSES
    encryption: Encryption | None = None

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
        on_event: OnEvent = None,
        clock: Clock = SYSTEM_CLOCK,
        wait_seconds: float = 0,
        problem_base_url: str | None = None,
        clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS,
        check_store: bool = False,
        stored_statuses: Iterable[int] = DEFAULT_STORED_STATUSES,
        encryption: Encryption | None = None,
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
        hook = one_hook(on_event)
        check_non_negative(wait_seconds, "wait_seconds")
        check_non_negative(clock_skew_seconds, "clock_skew_seconds")
        if not isinstance(clock, Clock):
            raise ValueError("clock must have now(), sleep() and asleep() (see clock.Clock)")
        if scope is not None and not callable(scope):
            raise ValueError("scope must be a callable taking a request view")
        if problem_base_url is not None:
            check_problem_base_url(problem_base_url)
        statuses = check_stored_statuses(stored_statuses)
        check_encryption(encryption)
        rules = tuple(rules)
        for rule in rules:
            if not isinstance(rule, IdempotencyRule):
                raise ValueError(f"rules must hold IdempotencyRule objects, got {rule!r}")
        check_reachable(rules)
        normalized_methods = normalize_methods(methods, "methods")
        default_policy = _policy(
            None,
            bool(required),
            ttl_seconds,
            lock_timeout_seconds,
            scope,
            float(wait_seconds),
            float(clock_skew_seconds),
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
            on_event=hook,
            clock=clock,
            wait_seconds=float(wait_seconds),
            problem_base_url=problem_base_url,
            check_store=bool(check_store),
            default_policy=default_policy,
            rule_policies=rule_policies,
            stored_statuses=statuses,
            encryption=encryption,
        )

    def with_route_rules(self, rules: Iterable[IdempotencyRule]) -> Options:
        """A copy whose requests first meet these route opt-ins (replacing any it had).

        Each rule is one route, in the router's order: its template and its methods
        (``IdempotencyKey`` beside a FastAPI route). Unlike ``rules``, which match on the
        path alone, a route matches on path *and* method, as the router does; the first
        route matching decides. An enabled rule is an opt-in (fields left ``None`` inherit
        the defaults); a disabled one is a route without an opt-in, whose requests go on to
        the rules and the defaults, as do requests no route matches.
        """
        route_policies: list[tuple[IdempotencyRule, frozenset[str], Policy | None]] = []
        for rule in rules:
            if not isinstance(rule, IdempotencyRule):
                raise ValueError(f"route rules must be IdempotencyRule objects, got {rule!r}")
            if not rule.enabled:
                route_policies.append((rule, frozenset(rule.methods or ()), None))
                continue
            methods, policy = _rule_policy(rule, self.methods, self.default_policy)
            assert policy is not None  # an enabled rule has one
            route_policies.append((rule, methods, policy._replace(route_opt_in=True)))
        return dataclasses.replace(self, route_policies=tuple(route_policies))

    def policy_for(self, method: str, path: str, root_path: str = "") -> Policy | None:
        """The policy for a covered request, or ``None`` when it passes straight through.

        ``root_path`` (ASGI's) is stripped from ``path`` for the route opt-ins only: their
        templates are the app's own, which its router matches without the root path. The
        rules keep matching the whole path, as they always have.
        """
        if self.route_policies:
            route_path = _route_path(path, root_path)
            for rule, methods, policy in self.route_policies:
                if method in methods and rule.pattern.match(route_path) is not None:
                    if policy is not None:
                        return policy
                    break  # the route that takes it has no opt-in
        for rule, methods, found in self.rule_policies:
            if rule.pattern.match(path) is not None:
                return found if method in methods else None
        return self.default_policy if method in self.methods else None

    def policy_for_template(self, method: str, template: str) -> Policy | None:
        """The policy requests to a route template get, as far as the template tells: a route
        opt-in with that template, else the first rule matching it (see
        ``template_matches``). For documentation (OpenAPI), not for requests."""
        for rule, methods, policy in self.route_policies:
            if method in methods and rule.path == template:
                if policy is not None:
                    return policy
                break
        for rule, methods, found in self.rule_policies:
            if template_matches(rule, template):
                return found if method in methods else None
        return self.default_policy if method in self.methods else None


def check_stored_statuses(value: object) -> frozenset[int]:
    """``stored_statuses`` as a set of HTTP status codes; ``ValueError`` naming a value
    that is not one (100-599)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(
            "stored_statuses must be a collection of HTTP status codes, such as "
            f"range(200, 300), got {value!r}"
        )
    statuses = tuple(value)
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(
                f"stored_statuses holds {status!r}, which is not an HTTP status code (100-599)"
            )
    return frozenset(statuses)


def check_problem_base_url(value: object) -> None:
    """A problem base URL must be an absolute http(s) URL of URI characters: it is where
    the problem documentation lives, and it goes into a Link header as it is."""
    try:
        parts = urlsplit(value) if isinstance(value, str) and _URI_CHARACTERS.match(value) else None
    except ValueError:  # a malformed IPv6 host
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            "problem_base_url must be an absolute http(s) URL such as "
            f"'https://api.example.com/problems/', got {value!r}"
        )


def _route_path(path: str, root_path: str) -> str:
    """The path an ASGI router matches: ``path`` without ``root_path`` (as Starlette's
    ``get_route_path``), or ``path`` itself when it does not start with it."""
    if not root_path or not path.startswith(root_path):
        return path
    rest = path[len(root_path) :]
    return rest if not rest or rest[0] == "/" else path


_PARAMETER = re.compile(r"{[^{}]*}")


def template_matches(rule: IdempotencyRule, template: str) -> bool:
    """Whether ``rule`` covers the requests of route ``template``: its pattern matches the
    template as text (``{order_id}`` is a segment like any other), or the two templates
    are the same with parameter names and convertors set aside (``/orders/{id:int}`` and
    ``/orders/{order_id}``)."""
    if rule.pattern.match(template) is not None:
        return True
    return _PARAMETER.sub("{}", rule.path) == _PARAMETER.sub("{}", template)


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
        clock_skew_seconds=default.clock_skew_seconds,
    )
