"""FastAPI integration: opt a route in beside it, and show idempotency in the OpenAPI schema.

- ``IdempotencyKey(...)``, a dependency: ``dependencies=[Depends(IdempotencyKey())]`` on a
  route, or a parameter ``key: Annotated[str | None, Depends(IdempotencyKey())]``, opts that
  route (its path template and methods) in. ``IdempotencyMiddleware`` reads the opt-ins from
  the app's routes once, at its first scope, and turns each into an ``IdempotencyRule``
  checked before the ``rules`` option (``Options.with_route_rules``): the settings are
  validated and inherited by the rules' own code.
- ``document_idempotency(app)`` adds the key header and the middleware's own responses to
  every operation the middleware covers.

Importing this module imports FastAPI; importing the package does not. On import, this
module hands the ASGI door its route reader and scope marker (``add_route_opt_ins``):
the door knows no framework, and reads routes only of an app whose integration was imported.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the annotations of
# ``IdempotencyKey.__call__`` at run time, and a callable object has no ``__globals__`` in
# which older FastAPI versions could resolve them as strings.

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fastapi import FastAPI, routing
from starlette.requests import Request

from ..engine import problems, refusals
from ..engine.problems import Problem
from ..policy.keys import MAX_KEY_LENGTH
from ..policy.options import DOOR_OPTIONS, Options, Policy, check_option_names, named_options
from ..policy.rules import COVERABLE_METHODS, IdempotencyRule, ScopeFunction
from .asgi import IdempotencyMiddleware
from .route_opt_ins import RouteOptIns, add_route_opt_ins

__all__ = [
    "COVERED_KEY",
    "PROBLEM_SCHEMA_NAME",
    "IdempotencyKey",
    "IdempotencyNotCoveredError",
    "document_idempotency",
    "route_rules",
]

# Set by IdempotencyMiddleware in the scope of every request a route opt-in covers, to its
# key (``None`` when the request has none and passed through), so the route's
# ``IdempotencyKey`` can tell a request covered by its own settings from one the middleware
# never applied them to.
COVERED_KEY = "idempotency_middleware.key"

PROBLEM_SCHEMA_NAME = "IdempotencyProblem"
PROBLEM_MEDIA_TYPE = "application/problem+json"

# Middlewares keep the app they wrap in ``.app``; the router (the object with ``routes``) is
# at most a few steps down. The bound only stops a chain that loops.
_MAX_WRAPPERS = 64
# An IdempotencyRule needs a template; the route's own replaces this one (for_route).
_PLACEHOLDER_PATH = "/"


class IdempotencyNotCoveredError(RuntimeError):
    """A route carrying ``IdempotencyKey`` got a request no ``IdempotencyMiddleware`` covered
    as that route's opt-in: running its handler would be running it unprotected."""


class IdempotencyKey:
    """Opt the route it stands beside into idempotency; as a parameter, the request's key.

    ``IdempotencyKey(*, required=None, ttl_seconds=None, lock_timeout_seconds=None,
    scope=None)``: the settings of an ``IdempotencyRule`` for this route (``None`` inherits
    the middleware's options), validated here, at construction. The route's path template
    and its methods (POST, PUT, PATCH, DELETE) are covered; the key namespace is the
    template. Called per request (FastAPI does that), it returns the parsed key, or ``None``
    when the request has none and the route does not require one.
    """

    __slots__ = ("rule",)

    @named_options("IdempotencyKey")
    def __init__(
        self,
        *,
        required: bool | None = None,
        ttl_seconds: float | None = None,
        lock_timeout_seconds: float | None = None,
        scope: ScopeFunction | None = None,
    ) -> None:
        self.rule = IdempotencyRule(
            _PLACEHOLDER_PATH,
            required=required,
            ttl_seconds=ttl_seconds,
            lock_timeout_seconds=lock_timeout_seconds,
            scope=scope,
        )

    def __repr__(self) -> str:
        rule = self.rule
        return (
            f"IdempotencyKey(required={rule.required!r}, ttl_seconds={rule.ttl_seconds!r}, "
            f"lock_timeout_seconds={rule.lock_timeout_seconds!r}, scope={rule.scope!r})"
        )

    def for_route(self, path: str, methods: Iterable[str]) -> IdempotencyRule:
        """This opt-in as the rule of one route: its template and its coverable methods."""
        return dataclasses.replace(self.rule, path=path, methods=sorted(methods))

    async def __call__(self, request: Request) -> str | None:
        scope = request.scope
        if COVERED_KEY in scope:
            key: str | None = scope[COVERED_KEY]
            return key
        if scope["method"] not in COVERABLE_METHODS:
            return None  # a GET on a route that also takes POST: nothing to protect
        raise IdempotencyNotCoveredError(
            f"{scope['method']} {scope['path']}: this route has IdempotencyKey, but no "
            "IdempotencyMiddleware covered the request as its opt-in, so the handler would "
            "run unprotected. Add the middleware to this app (app.add_middleware("
            "IdempotencyMiddleware, store=...)), or wrap the app in it, and define the route "
            "before the app starts: the middleware reads the routes once, at start-up or "
            "its first request."
        )


# --- reading the routes ---------------------------------------------------------------------


def route_rules(app: object) -> list[IdempotencyRule]:
    """The route opt-ins of ``app``, as rules, in the router's order.

    ``app`` is what the middleware wraps: a FastAPI or Starlette app, a router, or a chain of
    middlewares around one (followed through their ``.app``). Routes of mounted
    sub-applications are included, under their mount path. A route carrying an
    ``IdempotencyKey`` gives its opt-in; a route before the last opt-in without one gives a
    disabled rule, because the router would send it the requests it matches first
    (``POST /items/special`` declared before an opted-in ``POST /items/{item_id}``), and
    those must not get the later route's settings. Routes whose methods are all safe (GET)
    are skipped: nothing there to protect, and their ``IdempotencyKey`` (from a router's
    dependencies, say) returns ``None``. Raises ``ValueError`` for a route carrying two
    different ``IdempotencyKey``.
    """
    owner = _routes_owner(app)
    if owner is None:
        return []
    rules: list[IdempotencyRule] = []
    opted_in = 0  # how many of ``rules`` end with an opt-in
    for route, path in _api_routes(owner.routes, "", mounts=True):
        covered = sorted(set(route.methods or COVERABLE_METHODS) & COVERABLE_METHODS)
        if not covered:
            continue
        dependant = getattr(route, "dependant", None)
        keys = _keys_of(dependant) if dependant is not None else []
        if not keys:
            rules.append(IdempotencyRule(path, methods=covered, enabled=False))
            continue
        found = {key.rule for key in keys}
        if len(found) > 1:
            raise ValueError(
                f"{path} carries {len(found)} IdempotencyKey dependencies with different "
                f"settings ({', '.join(map(repr, keys))}); keep one"
            )
        rules.append(keys[0].for_route(path, covered))
        opted_in = len(rules)
    # Routes after the last opt-in shadow nothing.
    return rules[:opted_in]


def _routes_owner(app: object) -> Any:
    for _ in range(_MAX_WRAPPERS):
        if app is None or getattr(app, "routes", None) is not None:
            return app
        app = getattr(app, "app", None)
    return None


def _api_routes(routes: Sequence[Any], prefix: str, *, mounts: bool) -> Iterator[tuple[Any, str]]:
    """(route, its full template) for every HTTP route (an APIRoute, FastAPI's view of one
    inside an included router, or a plain Starlette Route), in the router's order; with
    ``mounts``, those of mounted applications too, their templates prefixed with the
    mount's."""
    # FastAPI versions that include routers lazily list them through iter_route_contexts;
    # older ones copy the routes into the app's list.
    contexts = getattr(routing, "iter_route_contexts", iter)(routes)
    for route in contexts:
        path = getattr(route, "path", None)
        if path is None:
            continue  # a Host route: it matches on the host, which templates do not see
        if getattr(route, "dependant", None) is not None:
            if getattr(route, "methods", None):  # not a WebSocket route
                yield route, prefix + path
        elif getattr(route, "methods", None):  # a plain Starlette Route
            yield route, prefix + path
        elif mounts:
            yield from _api_routes(getattr(route, "routes", None) or [], prefix + path, mounts=True)


def _keys_of(dependant: Any) -> list[IdempotencyKey]:
    """The ``IdempotencyKey`` objects among a route's dependencies, at any depth, once each."""
    keys: list[IdempotencyKey] = []
    pending = [dependant]
    while pending:
        current = pending.pop()
        call = current.call
        if isinstance(call, IdempotencyKey) and all(call is not key for key in keys):
            keys.append(call)
        pending.extend(current.dependencies)
    return keys


# Every IdempotencyMiddleware reads these routes (at its first scope) and marks the requests
# they cover with COVERED_KEY.
add_route_opt_ins(RouteOptIns(route_rules, COVERED_KEY))


# --- OpenAPI --------------------------------------------------------------------------------


def document_idempotency(app: FastAPI, *, middleware: IdempotencyMiddleware | None = None) -> None:
    """Make ``app.openapi()`` (and ``/openapi.json``, ``/docs``) show what the middleware does.

    Every operation the middleware covers (its ``methods``, ``rules`` and the route opt-ins)
    gets the key header, required or optional as its policy says, and the middleware's own
    responses (400, 409, 410, 413, 422, 500, 503) as ``application/problem+json``, sharing the
    ``IdempotencyProblem`` schema component. A status the operation already documents keeps
    its content (FastAPI's 422 validation error stays ``application/json``); ours is added
    beside it. The options are those of the ``IdempotencyMiddleware`` entry in
    ``app.user_middleware``; pass ``middleware=`` when you wrap the app in one yourself.
    Calling this twice changes nothing.
    """
    if isinstance(app.openapi, _DocumentedOpenAPI):
        return
    app.openapi = _DocumentedOpenAPI(app, app.openapi, middleware)  # type: ignore[method-assign]


class _DocumentedOpenAPI:
    """``app.openapi`` with idempotency added to each schema it hands out (FastAPI caches
    the schema, so each is documented once)."""

    def __init__(
        self,
        app: FastAPI,
        generate: Callable[[], dict[str, Any]],
        middleware: IdempotencyMiddleware | None,
    ) -> None:
        self._app = app
        self._generate = generate
        self._middleware = middleware
        self._documented: dict[str, Any] | None = None

    def __call__(self) -> dict[str, Any]:
        schema = self._generate()
        if schema is not self._documented:
            options = (
                self._middleware.options
                if self._middleware is not None
                else _middleware_options(self._app)
            )
            options = options.with_route_rules(route_rules(self._app))
            document_schema(schema, self._app.routes, options)
            self._documented = schema
        return schema


def _middleware_options(app: FastAPI) -> Options:
    """The options of the app's ``IdempotencyMiddleware`` entry, built as the middleware
    builds them."""
    for entry in app.user_middleware:
        if isinstance(entry.cls, type) and issubclass(entry.cls, IdempotencyMiddleware):
            # Starlette keeps the keyword arguments in .kwargs (older versions: .options).
            settings = dict(getattr(entry, "kwargs", None) or getattr(entry, "options", {}))
            check_option_names(entry.cls.__name__, settings, DOOR_OPTIONS)
            settings.pop("store", None)
            return Options.build(**settings)
    raise LookupError(
        "document_idempotency: the app has no IdempotencyMiddleware in app.user_middleware; "
        "add it with app.add_middleware(IdempotencyMiddleware, store=...), or pass the "
        "middleware you wrap the app in: document_idempotency(app, middleware=...)"
    )


def document_schema(schema: dict[str, Any], routes: Sequence[Any], options: Options) -> None:
    """Add the key header and the middleware's responses to each covered operation of
    ``schema`` (an OpenAPI document of ``routes``). Running it again changes nothing."""
    paths: dict[str, Any] = schema.get("paths", {})
    documented = False
    for route, template in _api_routes(routes, "", mounts=False):
        path_item = paths.get(route.path_format)
        for method in sorted(route.methods):
            operation = path_item.get(method.lower()) if path_item else None
            policy = options.policy_for_template(method, template)
            if operation is not None and policy is not None:
                _document_operation(operation, options, policy)
                documented = True
    if documented:
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components[PROBLEM_SCHEMA_NAME] = _PROBLEM_SCHEMA


_PROBLEM_SCHEMA: dict[str, Any] = {
    "title": PROBLEM_SCHEMA_NAME,
    "type": "object",
    "description": "An RFC 9457 problem made by the idempotency middleware itself.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {
            "type": "string",
            "format": "uri",
            "description": "What went wrong: a URN, or a documentation URL when the middleware "
            "has a problem_base_url.",
        },
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "A fixed sentence; never echoes input."},
    },
}

# What a client may send: a bare key (visible ASCII but , " \) or an RFC 8941 string (any
# visible ASCII or space, with " and \ escaped), 1-255 characters once unquoted; the parser
# (keys.parse_idempotency_key) accepts exactly these. The quotes and escapes make the
# header longer than the key: 255 escaped characters in quotes are 512.
KEY_PATTERN = (
    rf'^(?:[!#-+\--\[\]-~]{{1,{MAX_KEY_LENGTH}}}|"(?:[ !#-\[\]-~]|\\["\\]){{1,{MAX_KEY_LENGTH}}}")$'
)
_KEY_HEADER_MAX_LENGTH = 2 * MAX_KEY_LENGTH + 2

_RETRY_AFTER = {
    "description": "Seconds to wait before retrying with the same key.",
    "schema": {"type": "integer", "minimum": 0},
}
_LINK = {
    "description": 'The problem\'s documentation: `<type>; rel="describedby"`.',
    "schema": {"type": "string"},
}


def _document_operation(operation: dict[str, Any], options: Options, policy: Policy) -> None:
    header = options.header_name
    parameters: list[dict[str, Any]] = operation.setdefault("parameters", [])
    parameters[:] = [
        parameter
        for parameter in parameters
        if not (
            parameter.get("in") == "header"
            and str(parameter.get("name", "")).lower() == header.lower()
        )
    ]
    parameters.append(
        {
            "name": header,
            "in": "header",
            "required": policy.required,
            "description": (
                "Makes the request safe to retry: the first request with a key runs, and a "
                "retry with the same key and the same request gets the first response again "
                "(with Idempotent-Replayed: true). 1-255 visible ASCII characters, bare or as "
                'an RFC 8941 string ("...", which may also hold spaces); use a new key (a '
                "UUID) for each new request."
                + ("" if policy.required else " Without it, the request is not protected.")
            ),
            "schema": {
                "type": "string",
                "minLength": 1,
                "maxLength": _KEY_HEADER_MAX_LENGTH,
                "pattern": KEY_PATTERN,
            },
        }
    )
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for status, description, examples in _problem_responses(options, policy):
        headers: dict[str, Any] = {}
        if any(problem.retry_after is not None for problem in examples):
            headers["Retry-After"] = _RETRY_AFTER
        if options.problem_base_url is not None and status in problems.DESCRIBED_STATUSES:
            headers["Link"] = _LINK
        _add_response(responses, str(status), description, examples, headers, options)


def _problem_responses(
    options: Options, policy: Policy
) -> Iterator[tuple[int, str, list[Problem]]]:
    """(status, description, example problems) for each answer the middleware may give."""
    header = options.header_name
    invalid = problems.invalid_key(
        f"The idempotency key is longer than {MAX_KEY_LENGTH} characters.", header
    )
    if policy.required:
        yield 400, f"Missing or invalid {header} header", [problems.missing_key(header), invalid]
    else:
        yield 400, f"Invalid {header} header", [invalid]
    in_progress = problems.key_in_progress(refusals.IN_PROGRESS_RETRY_AFTER)
    yield 409, in_progress.title, [in_progress]
    not_stored = problems.response_not_stored(600_000)
    yield 410, not_stored.title, [not_stored]
    too_large = problems.body_too_large(options.max_body_bytes)
    yield 413, too_large.title, [too_large]
    reused = problems.fingerprint_mismatch()
    yield 422, reused.title, [reused]
    # (Beside a route's own 500s, if it documents any: the description says "Or: ...".)
    unreadable = problems.stored_response_unreadable()
    yield 500, unreadable.title, [unreadable]
    unavailable = problems.store_unavailable(refusals.STORE_UNAVAILABLE_RETRY_AFTER)
    # (Retry-After is documented for the outage; the misconfiguration answers without it.)
    misconfigured = problems.store_misconfigured()
    yield 503, unavailable.title, [unavailable, misconfigured]


def _add_response(
    responses: dict[str, Any],
    status: str,
    description: str,
    examples: list[Problem],
    headers: dict[str, Any],
    options: Options,
) -> None:
    media = {
        "schema": {"$ref": f"#/components/schemas/{PROBLEM_SCHEMA_NAME}"},
        "examples": {
            problem.slug: {
                "summary": problem.title,
                "value": problem.document(base_url=options.problem_base_url),
            }
            for problem in examples
        },
    }
    response = responses.setdefault(status, {"description": description})
    existing = response.get("description") or ""
    if description not in existing:  # FastAPI's own 422, or one the route declared
        response["description"] = f"{existing}. Or: {description}" if existing else description
    response.setdefault("content", {})[PROBLEM_MEDIA_TYPE] = media
    if headers:
        response.setdefault("headers", {}).update(headers)
