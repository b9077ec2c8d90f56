"""``IdempotencyRule``: per-route configuration, and Starlette-style route templates."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field

from .request_view import RequestView

ScopeFunction = Callable[[RequestView], str]

# Methods a rule or the middleware may make idempotent. GET, HEAD, OPTIONS and TRACE are
# safe by definition (RFC 9110 9.2.1), so a key on them would only cost a store call.
COVERABLE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Starlette's convertors: the same names, the same patterns.
_CONVERTORS = {
    "str": "[^/]+",
    "path": ".*",
    "int": "[0-9]+",
    "float": r"[0-9]+(?:\.[0-9]+)?",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
_PARAM = re.compile(r"{([^{}]*)}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def compile_template(template: str) -> re.Pattern[str]:
    """Compile ``/orders/{order_id}/refunds`` or ``/files/{rest:path}`` to an anchored regex."""
    if not isinstance(template, str) or not template.startswith("/"):
        raise ValueError(f"route template {template!r} must be a string starting with '/'")
    pattern = ["^"]
    names: set[str] = set()
    position = 0
    for match in _PARAM.finditer(template):
        literal = template[position : match.start()]
        if "{" in literal or "}" in literal:
            raise ValueError(f"route template {template!r} has an unbalanced brace")
        pattern.append(re.escape(literal))
        name, _, convertor = match.group(1).partition(":")
        if not _NAME.match(name):
            raise ValueError(f"route template {template!r}: {name!r} is not a parameter name")
        if name in names:
            raise ValueError(f"route template {template!r} repeats parameter {name!r}")
        names.add(name)
        convertor = convertor or "str"
        if convertor not in _CONVERTORS:
            raise ValueError(
                f"route template {template!r}: unknown convertor {convertor!r} "
                f"(use one of {', '.join(sorted(_CONVERTORS))})"
            )
        pattern.append(f"(?:{_CONVERTORS[convertor]})")
        position = match.end()
    tail = template[position:]
    if "{" in tail or "}" in tail:
        raise ValueError(f"route template {template!r} has an unbalanced brace")
    pattern.append(re.escape(tail))
    pattern.append(r"\Z")
    return re.compile("".join(pattern), re.DOTALL)  # a path may hold any character


def normalize_methods(methods: Iterable[str], where: str) -> frozenset[str]:
    if isinstance(methods, str):
        raise ValueError(f"{where}: methods must be a sequence of names, not a string")
    normalized = frozenset(str(method).upper() for method in methods)
    unknown = normalized - COVERABLE_METHODS
    if unknown:
        raise ValueError(
            f"{where}: cannot cover {', '.join(sorted(unknown))}; "
            f"idempotency keys apply to {', '.join(sorted(COVERABLE_METHODS))}"
        )
    return normalized


def check_positive(value: float | None, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")


def check_non_negative(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a non-negative, finite number of seconds, got {value!r}")


@dataclass(frozen=True)
class IdempotencyRule:
    """Configuration for the routes matching ``path``; ``None`` fields inherit the defaults.

    ``path`` is a Starlette-style template (``/orders/{order_id}``, ``/{rest:path}``).
    Rules match on the path alone and the first match wins; ``methods`` then say which
    methods of that route are covered. ``enabled=False`` leaves the route alone. Everything
    after ``path`` is keyword-only, so a rule reads the same wherever it is written.
    """

    path: str
    _: KW_ONLY
    methods: Iterable[str] | None = None
    required: bool | None = None
    ttl_seconds: float | None = None
    lock_timeout_seconds: float | None = None
    scope: ScopeFunction | None = None
    enabled: bool = True
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", compile_template(self.path))
        if self.methods is not None:
            methods = normalize_methods(self.methods, f"IdempotencyRule({self.path!r})")
            if not methods and self.enabled:
                raise ValueError(
                    f"IdempotencyRule({self.path!r}) covers no method; "
                    "use enabled=False to switch a route off"
                )
            object.__setattr__(self, "methods", tuple(sorted(methods)))
        check_positive(self.ttl_seconds, f"IdempotencyRule({self.path!r}).ttl_seconds")
        check_positive(
            self.lock_timeout_seconds, f"IdempotencyRule({self.path!r}).lock_timeout_seconds"
        )
        if self.scope is not None and not callable(self.scope):
            raise ValueError(f"IdempotencyRule({self.path!r}).scope must be callable")

    def matches(self, path: str) -> bool:
        return self.pattern.match(path) is not None


_CATCH_ALL = re.compile(r"([^{}]*)\{[A-Za-z_][A-Za-z0-9_]*:path\}")


def _catch_all_prefix(rule: IdempotencyRule) -> str | None:
    """``/api/`` for ``/api/{rest:path}``: the rule matches every path with that prefix."""
    match = _CATCH_ALL.fullmatch(rule.path)
    return match.group(1) if match else None


def _literal_prefix(rule: IdempotencyRule) -> str:
    return rule.path.split("{", 1)[0]


def check_reachable(rules: tuple[IdempotencyRule, ...]) -> None:
    """Refuse rules that can never match because an earlier one always wins: the same
    template, or an earlier catch-all (``/api/{rest:path}``) covering the later's prefix."""
    for index, rule in enumerate(rules):
        for earlier in rules[:index]:
            prefix = _catch_all_prefix(earlier)
            covered = prefix is not None and _literal_prefix(rule).startswith(prefix)
            if earlier.pattern.pattern == rule.pattern.pattern or covered:
                raise ValueError(
                    f"IdempotencyRule({rule.path!r}) can never match: "
                    f"IdempotencyRule({earlier.path!r}) comes first and matches every path it does"
                )
