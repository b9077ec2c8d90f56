"""``IdempotencyWSGIMiddleware``: the WSGI door (Flask, Django, any WSGI app).

A translation only: read the key and the body from the environ, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..engine import decisions, flow, refusals
from ..engine.drivers import Suspended, SyncDriver
from ..engine.effects import Ran, StreamEnd
from ..engine.renewal import ThreadRenewals
from ..policy.options import DOOR_OPTIONS, MiddlewareOptions, Options, check_option_names
from ..stores.catalog import A_SYNC_STORE
from ..stores.protocol import SyncStore
from ..stores.records import StoredResponse
from . import wsgi_environ as wsgi_io
from .capture import UnfinishedResponse
from .wsgi_environ import Environ, StartResponse, WSGIApp

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Environ", "IdempotencyWSGIMiddleware", "StartResponse", "WSGIApp"]


class IdempotencyWSGIMiddleware:
    """Make covered requests (POST and PATCH by default) safe to retry.

    Flask: ``app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=DynamoDBStore(...))``.
    The store must be sync: ``DynamoDBStore``, ``RedisStore``, ``PostgresStore``,
    ``SQLiteStore`` or ``MemoryStore``.
    """

    def __init__(
        self, wsgi_app: WSGIApp, *, store: SyncStore, **options: Unpack[MiddlewareOptions]
    ) -> None:
        check_option_names(type(self).__name__, options, DOOR_OPTIONS)
        if not isinstance(store, SyncStore):
            raise TypeError(
                f"IdempotencyWSGIMiddleware needs {A_SYNC_STORE}; "
                f"{type(store).__name__} has no claim/complete/release/renew. "
                "For an async store use IdempotencyMiddleware."
            )
        self.app = wsgi_app
        self.store = store
        self.options = Options.build(**options)
        if self.options.check_store:
            decisions.store_check(store, "check")()  # StoreUnavailableError: the app does not start
        self._context = flow.Context.for_options(self.options, store)
        self._renewals = ThreadRenewals(store, self._context.reporter, self.options.clock)
        self._driver = SyncDriver(store, self.options.clock, self._renewals)

    def close(self) -> None:
        """Stop the lease-renewal thread (it is a daemon thread; this is for tidy shutdowns
        and tests). The store is yours to close."""
        self._renewals.close()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        path = wsgi_io.request_path(environ)
        policy = self.options.policy_for(method, path)
        if policy is None:
            return self.app(environ, start_response)
        admitted = decisions.admit_request(
            self.options,
            policy,
            path,
            wsgi_io.key_lines(environ, self.options),
            environ.get("CONTENT_LENGTH") or None,
        )
        if admitted is None:
            return self.app(environ, start_response)
        if isinstance(admitted, decisions.Admitted):
            return self._handle(admitted, method, path, environ, start_response)
        return wsgi_io.send_problem(start_response, admitted, self.options.problem_base_url)

    def _handle(
        self,
        admitted: decisions.Admitted,
        method: str,
        path: str,
        environ: Environ,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        try:
            body = wsgi_io.read_body(environ, self.options.max_body_bytes)
        except wsgi_io.BodyTooLarge:
            return wsgi_io.send_problem(
                start_response,
                decisions.body_too_large(self.options),
                self.options.problem_base_url,
            )
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))

        attempt = decisions.begin_attempt(
            admitted,
            method=method,
            path=path,
            query_string=str(environ.get("QUERY_STRING", "")),
            content_type=environ.get("CONTENT_TYPE") or None,
            body=body,
            request_view=lambda route: wsgi_io.request_view(environ, method, path, route),
            now=self.options.clock.now(),
            owner=self._context.entropy.owner(),
        )
        captured = wsgi_io.CapturedResponse()
        running = flow.attempt(self._context, attempt)
        try:
            outcome = self._driver.drive(running, lambda: captured.run(self.app, environ))
        except Suspended:
            # A live stream: it goes out as it comes; the attempt finishes when it ends.
            assert captured.status_line is not None and captured.live is not None

            def finish(size: int, failed: bool) -> None:
                self._driver.resume(running, StreamEnd(size, failed))

            try:
                start_response(captured.status_line, captured.headers, captured.exc_info)
            except BaseException:
                # The server refused the headers: the stream never starts; nothing is kept.
                close = getattr(captured.live, "close", None)
                if close is not None:
                    close()
                finish(0, True)
                raise

            return wsgi_io.LiveBody(
                captured.buffer.take(), captured.live, finish, captured.complete
            )
        except UnfinishedResponse:
            return captured.send_cut(start_response, None)  # released; the server cuts it
        except Exception as error:
            if not captured.failed or captured.status_line is None:
                raise
            return captured.send_cut(start_response, error)  # released; the server cuts it
        if type(outcome) is Ran:
            assert captured.status_line is not None
            start_response(captured.status_line, captured.headers, captured.exc_info)
            return [outcome.body]
        if type(outcome) is StoredResponse:
            return wsgi_io.send_replay(start_response, outcome)
        if type(outcome) is decisions.Refusal:
            return wsgi_io.send_problem(
                start_response, refusals.problem_for(outcome), self.options.problem_base_url
            )
        if outcome is None:
            raise RuntimeError("the WSGI application returned without calling start_response")
        return self.app(environ, start_response)  # the store failed; on_store_error="run"
