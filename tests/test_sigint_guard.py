"""The guard that fails a test leaving SIGINT changed (tests/sigint_guard.py): it sees an
ignored handler and a blocked SIGINT, puts back what was there, and lets the unchanged pass."""

from __future__ import annotations

import signal

import pytest

from tests.sigint_guard import require_sigint_unchanged, sigint_state


def test_unchanged_passes() -> None:
    require_sigint_unchanged(sigint_state(), "nothing")


def test_an_ignored_sigint_fails_and_is_put_back() -> None:
    before = sigint_state()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with pytest.raises(pytest.fail.Exception, match=r"^the culprit left SIGINT's handler.*SIG_IGN"):
        require_sigint_unchanged(before, "the culprit")
    assert sigint_state() == before


def test_a_blocked_sigint_fails_and_is_put_back() -> None:
    before = sigint_state()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    with pytest.raises(pytest.fail.Exception, match=r"blocked \{SIGINT\} \(at the start"):
        require_sigint_unchanged(before, "the culprit")
    assert sigint_state() == before
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
