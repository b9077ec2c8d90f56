"""``IdempotencyMiddleware``: the pure ASGI door (FastAPI, Starlette, any ASGI app).

A translation only: read the key and the body from the ASGI messages, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from . import asgi_messages as messages
from . import core, problems
from .asgi_messages import ASGIApp, Message, Receive, Scope, Send
from .engine import flow
from .engine.drivers import AsyncDriver
from .engine.effects import Ran
from .options import MiddlewareOptions, Options
from .problems import Problem
from .records import StoredResponse
from .renewal import LoopRenewals
from .rules import IdempotencyRule
from .stores.base import AsyncStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "COVERED_KEY",
    "ASGIApp",
    "IdempotencyMiddleware",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

# Set in the scope of every request a route opt-in covers, to its key (``None`` when the
# request has none and passed through), so the route's ``fastapi.IdempotencyKey`` can tell
# a request covered by its own settings from one the middleware never applied them to.
COVERED_KEY = "idempotency_middleware.key"

# The FastAPI integration. Imported by the app when it uses IdempotencyKey; when it is not
# imported, no route can carry one, so the middleware never imports FastAPI itself.
_FASTAPI_MODULE = "idempotency_middleware.fastapi"


class IdempotencyMiddleware:
    """Make covered requests (POST and PATCH by default) safe to retry.

    ``app.add_middleware(IdempotencyMiddleware, store=AsyncDynamoDBStore("idempotency"))``.
    The store must be async (``AsyncDynamoDBStore``, ``SQLiteStore`` or ``MemoryStore``).
    The options (``options.MiddlewareOptions``) are listed in the documentation (Options).
    """

    def __init__(
        self, app: ASGIApp, *, store: AsyncStore, **options: Unpack[MiddlewareOptions]
    ) -> None:
        if not isinstance(store, AsyncStore):
            raise TypeError(
                f"IdempotencyMiddleware needs an async store (AsyncDynamoDBStore, SQLiteStore, "
                f"MemoryStore); {type(store).__name__} has no aclaim/acomplete/arelease/arenew. "
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

    def _read_routes(self) -> None:
        """Turn the app's route opt-ins (``IdempotencyKey`` beside a FastAPI route) into
        route policies, once. Routes added later are not seen; their ``IdempotencyKey``
        raises instead of running unprotected."""
        integration = sys.modules.get(_FASTAPI_MODULE)
        if integration is not None:
            rules: Sequence[IdempotencyRule] = integration.route_rules(self.app)
            if rules:
                self.options = self.options.with_route_rules(rules)
        # Only once they were read: a route that cannot be covered (a bad template, GET)
        # fails start-up, and every request after it, rather than being skipped.
        self._routes_unread = False

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
        admitted = core.admit(self.options, policy, scope["path"], key_lines)
        if admitted is None:
            if policy.route_opt_in:
                scope[COVERED_KEY] = None
            await self.app(scope, receive, send)
        elif isinstance(admitted, Problem):
            await messages.send_problem(send, admitted, self.options.problem_base_url)
        else:
            if policy.route_opt_in:
                scope[COVERED_KEY] = admitted.key
            await self._handle(admitted, content_length, content_type, scope, receive, send)

    async def _handle(
        self,
        admitted: core.Admitted,
        content_length: bytes | None,
        content_type: bytes | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        base_url = self.options.problem_base_url
        too_large = core.check_declared_length(self.options, content_length)
        if too_large is not None:
            await messages.send_problem(send, too_large, base_url)
            return
        try:
            body = await messages.read_body(receive, self.options.max_body_bytes)
        except messages.BodyTooLarge:
            too_large = problems.body_too_large(self.options.max_body_bytes)
            await messages.send_problem(send, too_large, base_url)
            return
        except messages.ClientGone:
            return  # nobody to answer and nothing claimed

        attempt = core.begin_attempt(
            admitted,
            method=scope["method"],
            path=scope["path"],
            query_string=scope.get("query_string", b""),
            content_type=content_type,
            body=body,
            request_view=lambda route: messages.request_view(scope, route),
            now=self.options.clock.now(),
        )
        start: Message | None = None

        async def run() -> Ran | None:
            nonlocal start
            capture = messages.ResponseCapture(send)  # (built only when the app runs)
            inner_receive = messages.replaying_receive(body, receive)
            await self.app(messages.without_bypass(scope), inner_receive, capture.send)
            ran = capture.ran()
            start = capture.start
            return ran

        waiter = (
            messages.disconnect_waiter(receive, self.options.clock)
            if admitted.policy.wait_seconds
            else None
        )
        outcome = await self._driver.drive(flow.attempt(self._context, attempt), run, waiter)
        if type(outcome) is Ran:
            if not outcome.live:
                assert start is not None
                await send(start)
                await send({"type": "http.response.body", "body": outcome.body, "more_body": False})
        elif type(outcome) is StoredResponse:
            await messages.send_replay(send, outcome)
        elif type(outcome) is core.Refusal:
            await messages.send_problem(send, problems.for_refusal(outcome), base_url)
        elif outcome is flow.RUN_UNPROTECTED:  # the store failed and on_store_error="run"
            await self.app(scope, messages.replaying_receive(body, receive), send)
        # else None: the app sent nothing; the server answers 500 itself
