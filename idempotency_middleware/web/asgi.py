"""``IdempotencyMiddleware``: the pure ASGI door (FastAPI, Starlette, any ASGI app).

A translation only: read the key and the body from the ASGI messages, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from ..engine import decisions
from ..engine.setup import AsyncSetup
from ..policy.options import DOOR_OPTIONS, MiddlewareOptions, Options, check_option_names
from ..stores.catalog import AN_ASYNC_STORE
from ..stores.protocol import AsyncStore
from . import asgi_messages as messages
from .answers import answer, problem_reply
from .asgi_messages import ASGIApp, Message, Receive, Scope, Send
from .capture import UnfinishedResponse
from .route_opt_ins import read_route_opt_ins

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "ASGIApp",
    "IdempotencyMiddleware",
    "Message",
    "Receive",
    "Scope",
    "Send",
]


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
        check_option_names(type(self).__name__, options, DOOR_OPTIONS)
        if not isinstance(store, AsyncStore):
            raise TypeError(
                f"IdempotencyMiddleware needs {AN_ASYNC_STORE}; "
                f"{type(store).__name__} has no aclaim/acomplete/arelease/arenew. "
                "For a sync store use IdempotencyWSGIMiddleware."
            )
        self.app = app
        self.store = store
        self.options = Options.build(**options)
        self._check: Callable[[], Awaitable[None]] | None = (
            decisions.store_check(store, "acheck") if self.options.check_store else None
        )
        # A store with a client to create (AsyncDynamoDBStore) creates it at start-up.
        self._warm_up: Callable[[], Awaitable[None]] | None = getattr(store, "awarm_up", None)
        setup = AsyncSetup.for_options(self.options, store)
        # Bound once: read on every new key.
        self._now = setup.now
        self._new_owner = setup.new_owner
        self._drive = setup.drive
        # The app's routes are read at the first scope (lifespan start-up or the first
        # request), when they are all defined, not here: the app may still be growing.
        self._routes_unread = True
        # The scope keys of the registered integrations whose opt-ins this door applies.
        self._opt_in_keys: tuple[str, ...] = ()
        self._read_hot_settings()

    def _read_hot_settings(self) -> None:
        """Copy what every request reads out of ``options`` into attributes of the door
        (again whenever ``options`` is replaced): one attribute read each on the hot path.
        ``_default_methods`` is set when no rule or route opt-in applies, so a request's
        policy is the default one for those methods (``Options.policy_for`` in short)."""
        options = self.options
        self._header_key = options.header_key
        self._max_body_bytes = options.max_body_bytes
        self._problem_base_url = options.problem_base_url
        # A declared Content-Length shorter than the limit written out in digits cannot
        # exceed it (nor can a malformed one count), so only a longer one is parsed.
        self._length_digits = len(str(options.max_body_bytes))
        self._default_policy = options.default_policy
        self._default_methods = (
            None if options.rule_policies or options.route_policies else options.methods
        )

    def _read_routes(self) -> None:
        """Turn the app's route opt-ins (``RouteOptIns`` of the registered integrations)
        into route policies, once. Routes added later are not seen; an integration's
        route then refuses to run unprotected."""
        rules, keys = read_route_opt_ins(self.app)
        if rules:
            self.options = self.options.with_route_rules(rules)
            self._opt_in_keys = keys
            self._read_hot_settings()
        # Only once they were read: a route that cannot be covered (a bad template, GET)
        # fails start-up, and every request after it, rather than being skipped.
        self._routes_unread = False

    def _mark_opt_in(self, scope: Scope, key: str | None) -> None:
        """Tell the route, through its scope, that its own opt-in covered the request."""
        for scope_key in self._opt_in_keys:
            scope[scope_key] = key

    async def _start_up(self, receive: Receive, send: Send) -> Receive | None:
        """Read the routes and check the store (once) as the lifespan starts: the receive
        to give the app, or ``None`` when start-up failed."""
        check, self._check = self._check, None
        read_routes = self._read_routes if self._routes_unread else None
        return await messages.start_lifespan(receive, send, read_routes, check)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            started = await self._start_up(receive, send)
            if started is None:
                return
            if self._warm_up is not None:
                started = messages.warming_receive(started, self._warm_up)
            await self.app(scope, started, send)
            return
        if self._routes_unread:
            self._read_routes()
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        methods = self._default_methods
        if methods is not None:
            policy = self._default_policy if scope["method"] in methods else None
        else:
            policy = self.options.policy_for(
                scope["method"], scope["path"], scope.get("root_path", "")
            )
        if policy is None:
            await self.app(scope, receive, send)
            return
        # One pass over the headers (``asgi_messages.read_headers``, inlined): most covered
        # requests carry no key and pass through, so its list is only made for a key.
        key_name = self._header_key
        key_lines: list[bytes] | None = None
        content_length = content_type = None
        for name, value in scope["headers"]:
            if name == key_name:
                if key_lines is None:
                    key_lines = [value]
                else:
                    key_lines.append(value)
            elif name == b"content-length":
                content_length = value
            elif name == b"content-type":
                content_type = value
        if key_lines is None:
            if not policy.required:
                if policy.route_opt_in:
                    self._mark_opt_in(scope, None)
                await self.app(scope, receive, send)
                return
            key_lines = []
        if content_length is not None and len(content_length) < self._length_digits:
            content_length = None  # within the limit: nothing to check
        admitted = decisions.admit_request(
            self.options, policy, scope["path"], key_lines, content_length
        )
        if policy.route_opt_in:
            self._mark_opt_in(scope, admitted.key if type(admitted) is decisions.Admitted else None)
        if admitted is None:
            await self.app(scope, receive, send)
            return
        if not isinstance(admitted, decisions.Admitted):
            await messages.send_reply(send, problem_reply(admitted, self._problem_base_url))
            return
        # A covered request with a key: read its body, then run the attempt. (In this
        # coroutine rather than one of its own: an await less on every new key.)
        try:
            message = await receive()
            if message["type"] != "http.disconnect" and not message.get("more_body", False):
                # The usual body, in one message (messages.read_body's first turn, inlined).
                body = message.get("body", b"")
                if len(body) > self._max_body_bytes:
                    raise messages.BodyTooLarge
            else:
                body = await messages.read_body(receive, self._max_body_bytes, message)
        except messages.BodyTooLarge:
            too_large = decisions.body_too_large(self.options)
            await messages.send_reply(send, problem_reply(too_large, self._problem_base_url))
            return
        except messages.ClientGone:
            return  # nobody to answer and nothing claimed

        # (Positional: a call by keyword costs more, on every request.)
        attempt = decisions.begin_attempt(
            admitted,
            scope["method"],  # method
            scope["path"],  # path
            scope.get("query_string", b""),  # query_string
            content_type,
            body,
            # request_view: only a scope function reads it (a partial: no closure)
            partial(messages.request_view, scope) if policy.scope is not None else None,
            self._now(),  # now
            self._new_owner(),  # owner
        )
        # Runs the app when the attempt says so, replaying it the body read, then answers.
        # (Its bound method, not a closure: a closure here would make cells of this
        # coroutine's variables, built on every call, a request without a key included.)
        capture = messages.ResponseCapture(send, body, receive, self.app, scope)
        waiter = (
            messages.disconnect_waiter(receive, self.options.clock) if policy.wait_seconds else None
        )
        try:
            outcome = await self._drive(attempt, capture.run, waiter)
        except UnfinishedResponse:
            # Released: the client gets the response as cut as the app left it.
            await capture.send_cut()
            return
        except Exception:
            if capture.failed and not capture.ended:
                # Raised midway: the client gets the cut, then the server the app's error.
                # (Raised after its response ended, as Starlette's error middleware does
                # after its 500, nothing was sent: the server answers its own 500.)
                await capture.send_cut()
            raise
        await answer(outcome, capture, self._problem_base_url)
