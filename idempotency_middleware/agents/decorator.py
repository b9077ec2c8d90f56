"""``idempotent_tool``: one tool function made idempotent, for the official ``mcp`` SDK's
``MCPServer`` and for ``fastmcp``; placed under the SDK's ``@server.tool()``.

The official SDK 2.x gives a tool the request's ``_meta`` only through a ``Context``
parameter, so the decorator declares one (``idempotency_context``) unless the tool has its
own; the SDK injects it and leaves it out of the tool's input schema. Its type names both
SDKs' ``Context``, so the same decorated function registers with either. The tool's return
value is converted to a tool result as its SDK converts it (from the return annotation),
which is what is stored; the wrapper then returns that result, which both SDKs pass on as
it is.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

try:
    from mcp.server.mcpserver import Context as SDKContext
    from mcp.server.mcpserver.utilities.func_metadata import func_metadata
    from mcp_types import CallToolResult
except ModuleNotFoundError as missing:  # tests/unit/test_missing_extras.py
    raise ModuleNotFoundError(
        "idempotency_middleware.mcp needs the mcp SDK (2 or later), which is not installed: "
        'pip install "idempotency-middleware[mcp]"',
        name="mcp",
    ) from missing

from ..functions.attempts import is_coroutine_callable, is_generator_callable
from ..functions.options import CallableOptions
from ..stores.protocol import AsyncStore, SyncStore
from .calls import ToolCalls, tool_options
from .keys import DEFAULT_KEY_ARGUMENT
from .results import WireResult
from .scopes import Scope, fastmcp_client, sdk_client

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..functions.options import CallableKeywords

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_PARAMETER = "idempotency_context"
"""The parameter the decorator declares for the SDK's ``Context`` when the tool has none."""

_OWN = ("key_argument", "scope")


def _context_types() -> tuple[type[Any], ...]:
    try:
        from fastmcp.server.context import Context as FastMCPContext
    except ModuleNotFoundError:  # (fastmcp needs Python 3.11)
        return (SDKContext,)
    return (SDKContext, FastMCPContext)


def idempotent_tool(
    *,
    store: SyncStore | AsyncStore,
    key_argument: str = DEFAULT_KEY_ARGUMENT,
    scope: Scope | None = None,
    **options: Unpack[CallableKeywords],
) -> Callable[[F], F]:
    """Run the decorated tool once per idempotency key; a retry gets the first call's
    result, marked ``_meta["idempotentReplayed"]``.

    The key is the request's ``_meta["idempotencyKey"]`` (or ``"idempotency-key"``), else
    the tool's ``key_argument`` argument. ``scope(context)`` (the SDK's ``Context``) keeps
    clients apart; default: the authenticated client's id. The keys are named after the
    tool (the function's name; give ``name=`` when ``@server.tool(name=...)`` renames it).
    Every shared option of ``idempotent`` applies, with ``required=False`` and
    ``wait_seconds=10`` as this door's defaults. Sync tools run in a worker thread. Needs an
    async store.
    """
    if not (isinstance(key_argument, str) and key_argument):
        raise TypeError(f"key_argument must be a non-empty string, got {key_argument!r}")
    if scope is not None and not callable(scope):
        raise TypeError(f"scope must be a callable taking the request context, got {scope!r}")
    built = tool_options("idempotent_tool()", store, _OWN, options)

    def decorate(function: F) -> F:
        return cast(F, _decorated(function, built, key_argument, scope))

    return decorate


def _decorated(
    function: Callable[..., Any],
    options: CallableOptions,
    key_argument: str,
    scope: Scope | None,
) -> Callable[..., Any]:
    if not callable(function):
        raise TypeError(f"idempotent_tool decorates a tool function, got {function!r}")
    tool = getattr(function, "__name__", type(function).__name__)
    if is_generator_callable(function):
        raise TypeError(
            f"idempotent_tool cannot make generator function {tool} idempotent: its "
            "result cannot be stored; return a list"
        )
    # Keys and metrics are named after the tool, as the fastmcp middleware names them, so a
    # server can move between the two doors without its keys changing meaning.
    name = options.name or tool
    is_async = is_coroutine_callable(function)
    signature = _evaluated_signature(function)
    context_types = _context_types()
    own_context = _context_parameter(function, context_types)
    if own_context is None and CONTEXT_PARAMETER in signature.parameters:
        raise TypeError(
            f"tool {tool} has a parameter named {CONTEXT_PARAMETER!r} that is no Context: "
            "idempotent_tool declares that one itself; rename yours"
        )
    context_parameter = own_context or CONTEXT_PARAMETER
    calls: ToolCalls[CallToolResult] = ToolCalls(options, key_argument)
    convert = _Conversions(function, own_context)

    @functools.wraps(function)
    async def call(*args: Any, **kwargs: Any) -> CallToolResult:
        context = kwargs[context_parameter] if own_context else kwargs.pop(context_parameter)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = {key: value for key, value in bound.arguments.items() if key != own_context}

        async def run() -> tuple[WireResult, CallToolResult]:
            if is_async:
                value = await function(*args, **kwargs)
            else:  # off the event loop (the thread gets this call's context variables)
                value = await asyncio.to_thread(function, *args, **kwargs)
            made = convert(context, value)
            return made.model_dump(by_alias=True, exclude_none=True, mode="json"), made

        fastmcp = not isinstance(context, SDKContext)
        request = context.request_context
        found = (scope or (fastmcp_client if fastmcp else sdk_client))(context)
        if found is not None and not isinstance(found, str):
            raise TypeError(f"scope must return a str or None, got {found!r}")
        answer = await calls.call(
            tool,
            request.meta if request is not None else None,
            arguments,
            found,
            run,
            namespace=name,
        )
        if isinstance(answer, dict):
            return CallToolResult.model_validate(answer)
        return answer

    if own_context is None:
        # Declared keyword-only, after the tool's own parameters (before a **kwargs).
        annotation: Any = typing.Union[context_types] if len(context_types) > 1 else SDKContext  # noqa: UP007
        parameters = list(signature.parameters.values())
        added = inspect.Parameter(
            CONTEXT_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=annotation
        )
        at = len(parameters)
        if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
            at -= 1
        parameters.insert(at, added)
        call.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        # (functools.wraps shared the function's own dict: copied before adding to it.)
        call.__annotations__ = {**function.__annotations__, CONTEXT_PARAMETER: annotation}
    return call


def _evaluated_signature(function: Callable[..., Any]) -> inspect.Signature:
    """``function``'s signature, its annotations evaluated where they can be.

    The SDKs read the wrapper's ``__signature__`` as it is, without evaluating it: a return
    annotation left a string (``from __future__ import annotations``) would give the tool
    another output schema than the undecorated function's (the official SDK wraps what it
    cannot resolve as ``{"result": ...}``).
    """
    try:
        return inspect.signature(function, eval_str=True)
    except Exception:  # (a name defined later, or only under TYPE_CHECKING)
        return inspect.signature(function)


def _context_parameter(function: Callable[..., Any], types: tuple[type[Any], ...]) -> str | None:
    """The tool's own parameter of either SDK's ``Context`` type, if it has one."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:
        return None
    for parameter, hint in hints.items():
        members = typing.get_args(hint) or (hint,)
        if parameter != "return" and any(
            inspect.isclass(member) and issubclass(member, types) for member in members
        ):
            return parameter
    return None


class _Conversions:
    """The tool's return value as its SDK's tool result: each SDK's conversion of this
    function, built at its first call under that SDK."""

    def __init__(self, function: Callable[..., Any], own_context: str | None) -> None:
        self._function = function
        self._skip = [own_context] if own_context else []
        self._sdk: Callable[[Any], Any] | None = None
        self._fastmcp: Callable[[Any], Any] | None = None

    def __call__(self, context: object, value: Any) -> CallToolResult:
        if isinstance(value, CallToolResult):
            return value
        if isinstance(context, SDKContext):
            made = self._sdk_conversion(context)(value)
            return made if isinstance(made, CallToolResult) else CallToolResult.model_validate(made)
        if self._fastmcp is None:
            from fastmcp.tools.function_tool import FunctionTool

            self._fastmcp = FunctionTool.from_function(self._function).convert_result
        from .middleware import wire_result

        return CallToolResult.model_validate(wire_result(self._fastmcp(value)))

    def _sdk_conversion(self, context: SDKContext) -> Callable[[Any], Any]:
        # The registered tool's own conversion: the output schema it validates against
        # (``structured_output=`` of ``@server.tool()`` included). The function's own
        # conversion is the fallback: the same result, but for ``structured_output=False``,
        # which it cannot see (tests/unit/test_mcp_conversions.py runs both).
        params = context.request_context.params or {}
        registered = registered_tool(context.mcp_server, params.get("name"))
        metadata = getattr(registered, "fn_metadata", None)
        if metadata is not None:
            return cast(Callable[[Any], Any], metadata.convert_result)
        if self._sdk is None:
            self._sdk = func_metadata(self._function, skip_names=self._skip).convert_result
        return self._sdk


def registered_tool(server: object, name: object) -> object | None:
    """The official SDK's registered tool ``name`` of ``server``, ``None`` when not found.

    The SDK offers no public lookup of a tool: this reads its private tool manager, and
    finds nothing (so the caller falls back) if a release renames or reshapes it.
    """
    manager = getattr(server, "_tool_manager", None)
    get_tool = getattr(manager, "get_tool", None)
    if not callable(get_tool) or not isinstance(name, str):
        return None
    try:
        return cast(object, get_tool(name))
    except Exception:  # (a reshaped lookup: the fallback serves)
        return None


__all__ = ["CONTEXT_PARAMETER", "idempotent_tool", "registered_tool"]
