"""The check behind tests/conftest.py's autouse ``_sigint_left_alone``: no test may leave
SIGINT's handler or the signal mask changed.

A process inherits an ignored SIGINT handler and the blocked-signal mask, and Python then
installs no KeyboardInterrupt handler of its own: a server that a test starts after SIGINT was
left ignored or blocked in the test process cannot be stopped with Ctrl-C (waitress relies on
Python's handler), and one that installs its own handlers (uvicorn) still never sees a blocked
SIGINT. A test that changes either fails, naming what changed, and both are put back so the
tests after it run as they should.
"""

from __future__ import annotations

import signal

import pytest

SigintState = tuple[object, frozenset[int]]


def sigint_state() -> SigintState:
    """SIGINT's handler and the main thread's blocked signals (what a child inherits)."""
    return signal.getsignal(signal.SIGINT), frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ()))


def _name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal between SIGRTMIN and SIGRTMAX has no name
        return str(number)


def _names(blocked: frozenset[int]) -> str:
    return "{" + ", ".join(_name(number) for number in sorted(blocked)) + "}"


def require_sigint_unchanged(expected: SigintState, culprit: str) -> None:
    """Nothing if SIGINT's handler and the mask are ``expected``; else restore them and fail
    the running test, naming ``culprit``."""
    now = sigint_state()
    if now == expected:
        return
    handler, blocked = expected
    # None: a handler not set from Python, which Python cannot put back.
    if callable(handler) or isinstance(handler, int):
        signal.signal(signal.SIGINT, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    pytest.fail(
        f"{culprit} left SIGINT's handler or the signal mask changed: handler {now[0]!r}, "
        f"blocked {_names(now[1])} (at the start: {handler!r}, blocked {_names(blocked)}). "
        "A child process inherits both, and one that inherits an ignored or blocked SIGINT "
        "cannot be stopped with Ctrl-C: restore them where they are changed "
        "(signal.signal, signal.pthread_sigmask).",
        pytrace=False,
    )
