"""One MCP tool call through the one attempt: what both MCP doors share.

A door (the fastmcp middleware, the tool decorator) reads the call's tool, ``_meta``,
arguments and scope, and hands ``ToolCalls.call`` a ``run`` that runs the tool and gives
its result in wire form beside the SDK's own object. The answer is that object (the tool
ran now), or a wire result (a replay, or the door's tool error) the door turns into its
SDK's type.

A tool's run outlives its caller: when the client disconnects (fastmcp then cancels the
tool) or times out, the run still finishes and its result is stored, so the agent's retry
gets it instead of running the side effect again.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Generic, TypeAlias, TypeVar, Union

from ..engine import flow
from ..engine.decisions import CALL_METHOD, Attempt, new_attempt
from ..engine.effects import Ran
from ..engine.refusals import Refusal
from ..engine.setup import AsyncSetup
from ..errors import InvalidKeyError
from ..functions.attempts import RESULT_STATUS, check_store
from ..functions.options import CallableKeywords, CallableOptions
from ..handler.context import CURRENT
from ..stores.protocol import AsyncStore, SyncStore
from ..stores.records import StoredResponse
from . import results
from .keys import call_key, tool_fingerprint, tool_key_hash
from .results import WireResult

DEFAULT_WAIT_SECONDS = 10.0
"""How long a duplicate waits for the running call's result before answering "still
running": an agent's retry is usually a duplicate of a call still running."""

ON_STORE_ERROR = {"fail": "fail", "run": "run", "allow": "run"}
"""The MCP doors' values of ``on_store_error``, as the shared option spells them: "allow"
(an unprotected run allowed when the store fails) is this door's word for "run"."""

T = TypeVar("T")
# A tool's run: its result in wire form, and as its SDK made it.
ToolRun = Callable[[], Awaitable[tuple[WireResult, T]]]
Answer: TypeAlias = Union[T, WireResult]  # noqa: UP007  (a generic alias, for Python 3.10)

# Tool runs that outlived their caller, kept referenced until they end.
_RUNNING: set[asyncio.Future[Any]] = set()


def tool_options(
    door: str,
    store: SyncStore | AsyncStore,
    own: Collection[str],
    options: CallableKeywords,
) -> CallableOptions:
    """The MCP doors' options: every shared option of ``idempotent``, with this door's
    defaults (``required=False``: a call without a key runs unprotected; ``wait_seconds=10``)
    and ``on_store_error="allow"`` accepted for ``"run"``, misspellings and bad values
    refused by name. The one place an MCP door builds them."""
    given: CallableKeywords = {"required": False, "wait_seconds": DEFAULT_WAIT_SECONDS}
    given.update(options)
    on_store_error = given.get("on_store_error", "fail")
    if not isinstance(on_store_error, str) or on_store_error not in ON_STORE_ERROR:
        raise ValueError(
            "on_store_error must be 'fail', 'run' or 'allow' (the same as 'run'), "
            f"got {on_store_error!r}"
        )
    given["on_store_error"] = ON_STORE_ERROR[on_store_error]
    built = CallableOptions.from_keywords(door, store=store, own=own, **given)
    check_store(built.store, True, f"{door}'s tool calls (always awaited by the MCP server)")
    return built


class _NotStored(Exception):
    """A tool's answer that is not kept (a tool error, an ask for input): the key is
    released and the answer given as it is."""

    def __init__(self, answer: Any) -> None:
        super().__init__("the tool's answer is not stored")
        self.answer = answer


class ToolCalls(Generic[T]):
    """The attempts of one MCP door's tool calls."""

    def __init__(self, options: CallableOptions, key_argument: str) -> None:
        self.options = options
        self.key_argument = key_argument
        attempt_options = options.attempt_options
        self.policy = attempt_options.default_policy
        self.clock = attempt_options.clock
        self.serializer = options.serializer
        assert isinstance(options.store, AsyncStore)  # (tool_options checked it)
        self.setup = AsyncSetup.for_options(attempt_options, options.store, http=False, door="mcp")
        self.context = self.setup.context

    async def call(
        self,
        tool: str,
        meta: Mapping[str, Any] | None,
        arguments: Mapping[str, Any],
        scope: str | None,
        run: ToolRun[T],
        namespace: str | None = None,
    ) -> Answer[T]:
        """Run the call of ``tool`` once per key (under ``scope``); ``namespace`` names its
        keys (default: the door's ``name=``, else the tool's name)."""
        try:
            key = call_key(tool, meta, arguments, self.key_argument)
        except InvalidKeyError as invalid:
            return results.not_run(tool, str(invalid))
        if key is None:
            if self.policy.required:
                return results.key_missing(tool, self.key_argument)
            return await _unprotected(run)
        try:
            fingerprint = tool_fingerprint(tool, arguments, self.key_argument)
        except TypeError as error:
            return results.not_run(tool, f"its arguments have no JSON form ({error})")
        route = namespace or self.options.name or tool
        attempt = new_attempt(
            self.policy._replace(route=route),
            CALL_METHOD,
            route,
            tool_key_hash(route, scope, key),
            fingerprint,
            self.clock.now(),
            self.context.entropy.owner(),
        )
        # Shielded: a caller that goes away leaves the run (and its completion) to finish.
        running = asyncio.ensure_future(self._attempt(tool, attempt, run))
        _RUNNING.add(running)
        running.add_done_callback(_ended)
        return await asyncio.shield(running)

    async def _attempt(self, tool: str, attempt: Attempt, run: ToolRun[T]) -> Answer[T]:
        ran: list[T] = []

        async def claimed() -> Ran:
            wire, made = await run()
            if not _kept(wire):
                raise _NotStored(made)
            body = results.encode(wire, self.serializer)
            ran.append(made)
            return Ran(RESULT_STATUS, [], body)

        try:
            ending = await self.setup.drive(attempt, claimed)
        except _NotStored as not_stored:
            return not_stored.answer  # type: ignore[no-any-return]
        if type(ending) is Ran:
            return ran[0]
        if ending is flow.RUN_UNPROTECTED:
            return await _unprotected(run)
        if type(ending) is StoredResponse:
            return self._replayed(tool, attempt, ending)
        assert type(ending) is Refusal, ending
        return self._refused(tool, ending)

    def _replayed(self, tool: str, attempt: Attempt, stored: StoredResponse) -> WireResult:
        try:
            return results.replayed(results.decode(stored.body, self.serializer))
        except Exception as error:
            reason = f"the stored result does not decode: {error!r}"
            reporter = self.context.reporter
            if reporter.wants("unreadable"):
                reporter.report(attempt, "unreadable", error=reason)
            return results.not_run(
                tool,
                f"a call with this key completed, but its stored result cannot be read "
                f"({reason}); it will not run again under this key",
            )

    def _refused(self, tool: str, refusal: Refusal) -> WireResult:
        reason = refusal.reason
        if reason == "in_progress":
            held = refusal.held_until
            wait = held - self.clock.now() if held is not None else None
            return results.still_running(tool, wait or refusal.retry_after or 1)
        if reason == "reused":
            return results.key_reused(tool)
        if reason in ("unavailable", "commit_unavailable"):
            seconds = math.ceil(refusal.retry_after or 1)
            answer = results.not_run(
                tool,
                "the idempotency store is unavailable, so it cannot be run safely; retry "
                f"with the same key in {seconds} s",
            )
            answer["_meta"] = {results.RETRY_AFTER: seconds}
            return answer
        if reason == "not_stored":
            return results.not_run(
                tool, "a call with this key completed, but its result was not kept"
            )
        return results.not_run(tool, str(refusal.error or reason))


def _kept(wire: WireResult) -> bool:
    """Whether a tool's answer is stored: a completed result that is no tool error."""
    return not results.is_error(wire) and wire.get("resultType", "complete") == "complete"


async def _unprotected(run: ToolRun[T]) -> T:
    # A call run without a claim is no attempt: inside another door's attempt it must not
    # take that attempt for its own.
    entered = CURRENT.set(None)
    try:
        _, made = await run()
        return made
    finally:
        CURRENT.reset(entered)


def _ended(running: asyncio.Future[Any]) -> None:
    _RUNNING.discard(running)
    if not running.cancelled():
        running.exception()  # retrieved: a caller gone away left no one to raise it to


__all__ = [
    "DEFAULT_WAIT_SECONDS",
    "ON_STORE_ERROR",
    "Answer",
    "ToolCalls",
    "ToolRun",
    "tool_options",
]
