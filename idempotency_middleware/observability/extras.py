"""The optional libraries the hooks stand on, imported when a hook is built."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_extra(module: str, extra: str, hook: str) -> ModuleType:
    """Import ``module``, or fail naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ModuleNotFoundError(
            f"{hook} needs {module.partition('.')[0]}, which is not installed: "
            f'pip install "idempotency-middleware[{extra}]"',
            name=module,
        ) from error
