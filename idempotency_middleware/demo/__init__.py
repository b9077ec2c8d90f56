"""The demo behind ``make demo`` and ``idempotency-middleware demo``: a FastAPI and a Flask
app on moto's DynamoDB server on 127.0.0.1, driven through replay, 422, 409, 400 and a
request without a key.

Needs the ``[demo]`` extra (FastAPI, Flask, uvicorn, waitress, httpx, moto).
"""

from __future__ import annotations

import sys

EXTRA = "demo"
# The top-level modules the demo imports that the package itself does not need: one of them
# missing means the extra is not installed. Any other ImportError is a bug, and propagates.
DEPENDENCIES = frozenset(
    {"aioboto3", "aiobotocore", "boto3", "botocore", "fastapi", "flask", "httpx", "moto"}
    | {"pydantic", "starlette", "uvicorn", "waitress", "werkzeug"}
)


def main(*, missing_extra: int) -> int:
    """Run the demo; its exit code, or ``missing_extra`` (the command line's code for a
    misconfiguration) when the ``[demo]`` extra is not installed."""
    try:
        from .runner import main as run
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in DEPENDENCIES:
            raise
        print(
            f"the demo needs the [{EXTRA}] extra ({missing} is not installed): "
            f'pip install "idempotency-middleware[{EXTRA}]"',
            file=sys.stderr,
        )
        return missing_extra
    return run()
