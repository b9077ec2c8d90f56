"""The guard that fails a test leaving SIGINT changed (tests/support/sigint_guard.py): it sees a
changed handler and a changed mask, puts back what was there, and lets the unchanged pass.
(The run may itself have started with SIGINT ignored or blocked: each test changes it from
whatever it is.)"""

from __future__ import annotations

import signal

import pytest

from tests.support.sigint_guard import require_sigint_unchanged, sigint_state


def test_unchanged_passes() -> None:
    require_sigint_unchanged(sigint_state(), "nothing")


def test_a_changed_handler_fails_and_is_put_back() -> None:
    before = sigint_state()
    other = signal.SIG_DFL if before[0] is signal.SIG_IGN else signal.SIG_IGN
    signal.signal(signal.SIGINT, other)
    with pytest.raises(pytest.fail.Exception, match=rf"^the culprit left .*{other.name}"):
        require_sigint_unchanged(before, "the culprit")
    assert sigint_state() == before


def test_a_changed_mask_fails_and_is_put_back() -> None:
    before = sigint_state()
    blocking = signal.SIGINT not in before[1]
    signal.pthread_sigmask(signal.SIG_BLOCK if blocking else signal.SIG_UNBLOCK, {signal.SIGINT})
    with pytest.raises(pytest.fail.Exception, match=r"^the culprit left .* signal mask changed"):
        require_sigint_unchanged(before, "the culprit")
    assert sigint_state() == before
