"""Randomness as an input, like time (``clock.py``): owner tokens and jitter come from one
provider the engine holds, so ``core`` and the attempt sequence stay pure and a test can
pin every draw."""

from __future__ import annotations

import itertools
import os
import random
from typing import Protocol, runtime_checkable


@runtime_checkable
class Entropy(Protocol):
    """Where the engine gets owner tokens and jitter."""

    def owner(self) -> str:
        """A fresh owner token for one attempt's claim, unique across processes."""
        ...

    def jitter(self) -> float:
        """A draw in ``[0, 1)`` that spreads retries and polls apart."""
        ...


# Owner tokens fence a claim's finishing writes. A random per-process prefix and a counter
# make them unique without a system call per request; a forked child draws its own prefix,
# so parent and child never hand out the same token.
_owner_prefix = os.urandom(12).hex() + "-"
_owner_numbers = itertools.count()


def new_owner() -> str:
    """A fresh owner token for one attempt's claim."""
    return f"{_owner_prefix}{next(_owner_numbers):x}"


def _new_owner_prefix() -> None:
    global _owner_prefix
    _owner_prefix = os.urandom(12).hex() + "-"


os.register_at_fork(after_in_child=_new_owner_prefix)


class SystemEntropy:
    """Real randomness: ``new_owner`` tokens and ``random.random`` jitter."""

    __slots__ = ()

    # The functions themselves, not methods wrapping them: drawn on every request.
    owner = staticmethod(new_owner)
    jitter = staticmethod(random.random)


SYSTEM_ENTROPY = SystemEntropy()
