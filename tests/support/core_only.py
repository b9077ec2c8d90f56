"""The core-only runs: a part of the suite on the other supported Pythons.

``make pythons`` (scripts/pythons.sh) runs the test files of tests/other_pythons.txt on each
supported Python besides 3.11, in a venv holding only the ``test-core`` extra: no moto,
boto3, web frameworks or brokers. It sets ``IDEMPOTENCY_TESTS_CORE_ONLY=1``; there a test
dependency that is not installed skips the test that needs it (the DynamoDB kinds of the
store contract, say). Anywhere else (the full suite, ``.[dev]`` installed) a missing one is
an error as before: a full run must not pass by skipping.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

CORE_ONLY_VARIABLE = "IDEMPOTENCY_TESTS_CORE_ONLY"
CORE_ONLY = os.environ.get(CORE_ONLY_VARIABLE) == "1"


def require_module(name: str) -> ModuleType:
    """``import name``; in a core-only run where it is not installed, skips the test."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if not CORE_ONLY:
            raise
        pytest.skip(f"{missing.name} is not installed (a core-only run: make pythons)")
