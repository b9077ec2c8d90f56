"""The SQS worker the consumer crash test runs in a subprocess and kills with SIGKILL.

``python -m tests.support.sqs_crash_worker``, configured by environment variables:

- ``CRASH_SQS_ENDPOINT``, ``CRASH_QUEUE_URL``: moto's SQS and the queue;
- ``CRASH_SQLITE``: the store's file (it survives the process);
- ``CRASH_EFFECTS_FILE``: the handler's side effect, one line appended (and fsynced) a run;
- ``CRASH_PAUSED_FILE``: written when the worker reaches ``CRASH_PAUSE_AT`` and stops there
  for good, waiting to be killed: ``before_effect`` (in the handler, before its side effect),
  ``after_effect`` (in the handler, after it, before the completion is stored) or
  ``before_delete`` (the completion stored, the message not yet deleted).

The consumer's options (name, key, lock timeout, clock skew margin) are ``consumer_options``,
shared with the test's second worker.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import boto3

from idempotency_middleware import IdempotentConsumer, SQLiteStore, SQSWorker

NAME = "tests.crash.payments"
LOCK_TIMEOUT_SECONDS = 1.0
CLOCK_SKEW_SECONDS = 0.1
VISIBILITY_TIMEOUT = 2  # above the lock timeout plus the margin: a redelivery takes over


def consumer_options() -> dict[str, Any]:
    return {
        "key": lambda message: message["MessageId"],
        "name": NAME,
        "lock_timeout_seconds": LOCK_TIMEOUT_SECONDS,
        "clock_skew_seconds": CLOCK_SKEW_SECONDS,
    }


def append_effect(path: Path, line: str) -> None:
    """The side effect: a line appended and on disk before the handler goes on."""
    with open(path, "a", encoding="utf-8") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())


def pause(paused: Path) -> None:
    """Say where the worker stopped, then wait to be killed."""
    paused.write_text(str(os.getpid()))
    threading.Event().wait()


class PausingClient:
    """boto3's SQS client, pausing before it deletes anything (``before_delete``)."""

    def __init__(self, client: Any, paused: Path) -> None:
        self._client = client
        self._paused = paused

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def delete_message_batch(self, **kwargs: Any) -> Any:
        pause(self._paused)
        return self._client.delete_message_batch(**kwargs)


def main() -> None:
    effects = Path(os.environ["CRASH_EFFECTS_FILE"])
    paused = Path(os.environ["CRASH_PAUSED_FILE"])
    pause_at = os.environ["CRASH_PAUSE_AT"]

    def handle(message: dict[str, Any]) -> str:
        if pause_at == "before_effect":
            pause(paused)
        append_effect(effects, f"{message['Body']} {os.getpid()}")
        if pause_at == "after_effect":
            pause(paused)
        return "paid"

    client: Any = boto3.client(
        "sqs", endpoint_url=os.environ["CRASH_SQS_ENDPOINT"], region_name="us-east-1"
    )
    if pause_at == "before_delete":
        client = PausingClient(client, paused)
    store = SQLiteStore(os.environ["CRASH_SQLITE"])
    consumer = IdempotentConsumer(handle, store=store, **consumer_options())
    worker = SQSWorker(
        consumer,
        os.environ["CRASH_QUEUE_URL"],
        client=client,
        wait_time_seconds=5,
        visibility_timeout=VISIBILITY_TIMEOUT,
    )
    while True:  # until killed
        worker.run_once()


if __name__ == "__main__":
    main()
