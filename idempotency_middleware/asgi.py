"""``IdempotencyMiddleware``: the pure ASGI door (FastAPI, Starlette, any ASGI app).

A translation only: read the key and the body from the ASGI messages, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from . import asgi_messages as messages
from . import core, refusals
from .asgi_messages import ASGIApp, Message, Receive, Scope, Send
from .engine import flow
from .engine.drivers import AsyncDriver
from .engine.effects import Ran
from .engine.renewal import LoopRenewals
from .options import MiddlewareOptions, Options
from .records import StoredResponse, UnfinishedResponse
from .rules import IdempotencyRule
from .stores.protocol import AN_ASYNC_STORE, AsyncStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "ASGIApp",
    "IdempotencyMiddleware",
    "Message",
    "Receive",
    "RouteOptIns",
    "Scope",
    "Send",
    "add_route_opt_ins",
]


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


# Integrations register when they are imported: an app that never imports one has no
# route carrying an opt-in, and the door never imports a framework itself.
_ROUTE_OPT_INS: list[RouteOptIns] = []


def add_route_opt_ins(opt_ins: RouteOptIns) -> None:
    """Register an integration's route opt-ins; every ``IdempotencyMiddleware`` reads them
    from its app at its first scope (registering the same one twice changes nothing)."""
    if opt_ins not in _ROUTE_OPT_INS:
        _ROUTE_OPT_INS.append(opt_ins)


class IdempotencyMiddleware:
    """Make covered requests (POST and PATCH by default) safe to retry.

    ``app.add_middleware(IdempotencyMiddleware, store=AsyncDynamoDBStore("idempotency"))``.
    The store must be async: ``AsyncDynamoDBStore``, ``RedisStore``, ``PostgresStore``,
    ``SQLiteStore`` or ``MemoryStore``.
    The options (``options.MiddlewareOptions``) are listed in the documentation (Options).
    """

    def __init__(
        self, app: ASGIApp, *, store: AsyncStore, **options: Unpack[MiddlewareOptions]
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise TypeError(
                f"IdempotencyMiddleware needs {AN_ASYNC_STORE}; "
                f"{type(store).__name__} has no aclaim/acomplete/arelease/arenew. "
                "For a sync store use IdempotencyWSGIMiddleware."
            )
        self.app = app
        self.store = store
        self.options = Options.build(**options)
        # A store with a client to create (AsyncDynamoDBStore) creates it at start-up.
        self._warm_up: Callable[[], Awaitable[None]] | None = getattr(store, "awarm_up", None)
        self._context = flow.Context.for_options(self.options, store)
        self._driver = AsyncDriver(
            store,
            self.options.clock,
            LoopRenewals(store, self._context.reporter, self.options.clock),
        )
        # The app's routes are read at the first scope (lifespan start-up or the first
        # request), when they are all defined, not here: the app may still be growing.
        self._routes_unread = True
        # The scope keys of the registered integrations whose opt-ins this door applies.
        self._opt_in_keys: tuple[str, ...] = ()

    def _read_routes(self) -> None:
        """Turn the app's route opt-ins (``RouteOptIns`` of the registered integrations)
        into route policies, once. Routes added later are not seen; an integration's
        route then refuses to run unprotected."""
        rules: list[IdempotencyRule] = []
        keys: list[str] = []
        for opt_ins in _ROUTE_OPT_INS:
            read = opt_ins.read(self.app)
            if read:
                rules.extend(read)
                keys.append(opt_ins.scope_key)
        if rules:
            self.options = self.options.with_route_rules(rules)
            self._opt_in_keys = tuple(keys)
        # Only once they were read: a route that cannot be covered (a bad template, GET)
        # fails start-up, and every request after it, rather than being skipped.
        self._routes_unread = False

    def _mark_opt_in(self, scope: Scope, key: str | None) -> None:
        """Tell the route, through its scope, that its own opt-in covered the request."""
        for scope_key in self._opt_in_keys:
            scope[scope_key] = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._routes_unread:
            try:
                self._read_routes()
            except ValueError as error:
                if scope["type"] != "lifespan":
                    raise
                # Fail start-up, loudly: an exception from a lifespan scope would only make
                # uvicorn's default ``--lifespan auto`` serve on without the app's lifespan.
                await receive()  # lifespan.startup
                await send({"type": "lifespan.startup.failed", "message": str(error)})
                return
        if scope["type"] != "http":
            if scope["type"] == "lifespan" and self._warm_up is not None:
                receive = messages.warming_receive(receive, self._warm_up)
            await self.app(scope, receive, send)
            return
        policy = self.options.policy_for(scope["method"], scope["path"], scope.get("root_path", ""))
        if policy is None:
            await self.app(scope, receive, send)
            return
        key_lines, content_length, content_type = messages.read_headers(
            scope["headers"], self.options.header_key
        )
        admitted = core.admit_request(
            self.options, policy, scope["path"], key_lines, content_length
        )
        if policy.route_opt_in:
            self._mark_opt_in(scope, admitted.key if type(admitted) is core.Admitted else None)
        if admitted is None:
            await self.app(scope, receive, send)
        elif isinstance(admitted, core.Admitted):
            await self._handle(admitted, content_type, scope, receive, send)
        else:
            await messages.send_problem(send, admitted, self.options.problem_base_url)

    async def _handle(
        self,
        admitted: core.Admitted,
        content_type: bytes | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            body = await messages.read_body(receive, self.options.max_body_bytes)
        except messages.BodyTooLarge:
            too_large = core.body_too_large(self.options)
            await messages.send_problem(send, too_large, self.options.problem_base_url)
            return
        except messages.ClientGone:
            return  # nobody to answer and nothing claimed

        # (Positional: a call by keyword costs more, on every request.)
        attempt = core.begin_attempt(
            admitted,
            scope["method"],  # method
            scope["path"],  # path
            scope.get("query_string", b""),  # query_string
            content_type,
            body,
            partial(messages.request_view, scope),  # request_view (no closure per request)
            self.options.clock.now(),  # now
            self._context.entropy.owner(),  # owner
        )
        start: Message | None = None
        capture: messages.ResponseCapture | None = None

        async def run() -> Ran | None:
            nonlocal start, capture
            # (Built only when the app runs; it also replays the body read to the app.)
            capture = messages.ResponseCapture(send, body, receive)
            inner_scope = messages.without_bypass(scope) if "extensions" in scope else scope
            try:
                await self.app(inner_scope, capture.receive, capture.send)
            except Exception:
                capture.failed = True
                raise
            ran = capture.ran()
            start = capture.start
            return ran

        waiter = (
            messages.disconnect_waiter(receive, self.options.clock)
            if admitted.policy.wait_seconds
            else None
        )
        try:
            outcome = await self._driver.drive(flow.attempt(self._context, attempt), run, waiter)
        except UnfinishedResponse:
            # Released: the client gets the response as cut as the app left it.
            assert capture is not None
            await capture.send_cut()
            return
        except Exception:
            if capture is not None and capture.failed and not capture.ended:
                # Raised midway: the client gets the cut, then the server the app's error.
                # (Raised after its response ended, as Starlette's error middleware does
                # after its 500, nothing was sent: the server answers its own 500.)
                await capture.send_cut()
            raise
        if type(outcome) is Ran:
            if not outcome.live:
                assert start is not None
                await send(start)
                await send({"type": "http.response.body", "body": outcome.body, "more_body": False})
        elif type(outcome) is StoredResponse:
            await messages.send_replay(send, outcome)
        elif type(outcome) is core.Refusal:
            problem = refusals.problem_for(outcome)
            await messages.send_problem(send, problem, self.options.problem_base_url)
        elif outcome is flow.RUN_UNPROTECTED:  # the store failed and on_store_error="run"
            await self.app(scope, messages.replaying_receive(body, receive), send)
        # else None: the app sent nothing; the server answers 500 itself
