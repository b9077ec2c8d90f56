"""The demo behind ``make demo`` and ``idempotency-middleware demo``: a FastAPI and a Flask
app on an embedded local DynamoDB endpoint (moto), driven through replay, 422, 409 and 400.

Needs the ``[demo]`` extra (FastAPI, Flask, uvicorn, waitress, httpx, moto).
"""

from __future__ import annotations


def main() -> int:
    from .runner import main as run

    return run()
