"""``IdempotencyWSGIMiddleware``: the WSGI door (Flask, Django, any WSGI app).

A translation only: read the key and the body from the environ, run the app with its
response captured, send the answer. The attempt itself is ``engine.flow.attempt``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..engine import decisions
from ..engine.setup import LiveStream, SyncSetup
from ..policy.options import DOOR_OPTIONS, MiddlewareOptions, Options, check_option_names
from ..stores.catalog import A_SYNC_STORE
from ..stores.protocol import SyncStore
from . import wsgi_environ as wsgi_io
from .answers import answer, problem_reply
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
        self._setup = SyncSetup.for_options(self.options, store)

    def close(self) -> None:
        """Stop the lease-renewal thread (it is a daemon thread; this is for tidy shutdowns
        and tests). The store is yours to close."""
        self._setup.close()

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
        reply = problem_reply(admitted, self.options.problem_base_url)
        return wsgi_io.send_reply(start_response, reply)

    def _handle(
        self,
        admitted: decisions.Admitted,
        method: str,
        path: str,
        environ: Environ,
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        base_url = self.options.problem_base_url
        try:
            body = wsgi_io.read_body(environ, self.options.max_body_bytes)
        except wsgi_io.BodyTooLarge:
            too_large = decisions.body_too_large(self.options)
            return wsgi_io.send_reply(start_response, problem_reply(too_large, base_url))
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
            now=self._setup.now(),
            owner=self._setup.new_owner(),
        )
        # Runs the app when the attempt says so, then answers.
        captured = wsgi_io.CapturedResponse(self.app, environ, start_response)
        try:
            outcome = self._setup.drive(attempt, captured.run)
        except LiveStream as live:
            # A live stream: it goes out as it comes; the attempt finishes when it ends.
            return captured.send_live(live.finish)
        except UnfinishedResponse:
            return captured.send_cut(None)  # released; the server cuts it
        except Exception as error:
            if not captured.failed or captured.status_line is None:
                raise
            return captured.send_cut(error)  # released; the server cuts it
        return answer(outcome, captured, base_url)
