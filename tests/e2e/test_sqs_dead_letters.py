"""``SQSWorker(dead_letter=...)`` on moto's SQS in server mode: a ``dead`` message reaches the
queue's dead-letter queue, and the consumers page's redrive steps bring it back to be handled
once.

moto (5.2) does not implement SQS's ``StartMessageMoveTask`` (it answers 500, "not been
implemented"): the redrive test tries it, and where it is refused moves the messages back
with the page's own fallback (receive, send, delete), as the page tells a user to.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from idempotency_middleware import (
    IdempotentConsumer,
    KeyReusedError,
    MemoryStore,
    SQLiteStore,
    SQSWorker,
)
from idempotency_middleware.consumers.sqs_dead_letters import DeadLetter, NoDeadLetterQueueError
from tests.conftest import REGION
from tests.e2e.test_sqs_worker import Boom, Handler, in_queue, message_key, new_queue, send

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
WAIT = 15.0  # a safety bound on waits for what should happen within a few receives
LOGGER = "idempotency_middleware.consumers.sqs_worker"


@pytest.fixture
def sqs(moto_endpoint: str) -> Iterator[Any]:
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=REGION)
    yield client
    client.close()


def queue_arn(sqs: Any, queue_url: str) -> str:
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    return str(attributes["Attributes"]["QueueArn"])


def queue_with_dead_letters(
    sqs: Any, max_receive_count: int = 1, fifo: bool = False
) -> tuple[str, str]:
    """A queue whose RedrivePolicy names a new dead-letter queue: (queue URL, its DLQ's URL)."""
    dead_letters = new_queue(sqs, fifo=fifo)
    queue_url = new_queue(sqs, fifo=fifo)
    arn = queue_arn(sqs, dead_letters)
    policy = {"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receive_count)}
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"RedrivePolicy": json.dumps(policy)})
    return queue_url, dead_letters


def peek(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    """The queue's visible messages (up to 10), left visible."""
    messages: list[dict[str, Any]] = sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=0,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    ).get("Messages", [])
    return messages


def settle_until(worker: SQSWorker, done: Callable[[], bool]) -> None:
    """Run batches until ``done()`` ("leave" needs a receive more: SQS moves the message on
    the receive after its count reached maxReceiveCount)."""
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, "not settled in time"
        worker.run_once()


def consumer_of(handler: Any, store: Any = None, **options: Any) -> IdempotentConsumer:
    options.setdefault("on_exhausted", lambda message, error: None)
    return IdempotentConsumer(
        handler,
        store=store or MemoryStore(),
        key=message_key,
        name=f"tests.dead.{uuid.uuid4().hex[:8]}",
        **options,
    )


def attributes_of(key: str) -> dict[str, Any]:
    return {"IdempotencyKey": {"DataType": "String", "StringValue": key}}


# -- where a dead message goes -----------------------------------------------------------------


@pytest.mark.parametrize("dead_letter", ["queue", "leave"])
def test_a_dead_message_lands_in_the_dead_letter_queue_with_its_body_and_attributes(
    sqs: Any, dead_letter: DeadLetter
) -> None:
    queue_url, dead_letters = queue_with_dead_letters(sqs)
    send(sqs, queue_url, "fail-1", key="o-1")
    consumer = consumer_of(Handler(), max_attempts=1)
    worker = SQSWorker(
        consumer, queue_url, client=sqs, wait_time_seconds=0, dead_letter=dead_letter
    )

    settle_until(worker, lambda: in_queue(sqs, dead_letters) == (1, 0))

    [landed] = peek(sqs, dead_letters)
    assert landed["Body"] == "fail-1"
    assert landed["MessageAttributes"] == attributes_of("o-1")
    assert in_queue(sqs, queue_url) == (0, 0)


def test_a_dead_message_is_deleted_by_default(sqs: Any) -> None:
    queue_url, dead_letters = queue_with_dead_letters(sqs)
    send(sqs, queue_url, "fail-1")
    worker = SQSWorker(consumer_of(Handler(), max_attempts=1), queue_url, client=sqs)

    [outcome] = worker.run_once()

    assert outcome.action == "dead" and worker.dead_letter == "delete"
    assert in_queue(sqs, queue_url) == (0, 0)
    assert in_queue(sqs, dead_letters) == (0, 0)


def test_on_exhausted_is_called_before_the_dead_letter_is_sent(sqs: Any) -> None:
    queue_url, dead_letters = queue_with_dead_letters(sqs)
    send(sqs, queue_url, "fail-1")
    seen: list[tuple[str, tuple[int, int]]] = []

    def exhausted(message: dict[str, Any], error: Exception) -> None:
        seen.append((message["Body"], in_queue(sqs, dead_letters)))

    consumer = consumer_of(Handler(), max_attempts=1, on_exhausted=exhausted)
    worker = SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=0, dead_letter="queue")

    [outcome] = worker.run_once()

    assert outcome.action == "dead" and isinstance(outcome.error, Boom)
    assert seen == [("fail-1", (0, 0))]
    assert in_queue(sqs, dead_letters) == (1, 0)


def test_a_fifo_dead_letter_keeps_its_group_and_is_deduplicated_on_its_message_id(
    sqs: Any,
) -> None:
    queue_url, dead_letters = queue_with_dead_letters(sqs, fifo=True)
    send(sqs, queue_url, "fail-a1", key="o-1", MessageGroupId="a")
    consumer = consumer_of(Handler(), max_attempts=1)
    worker = SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=0, dead_letter="queue")

    [outcome] = worker.run_once()

    [landed] = peek(sqs, dead_letters)
    assert outcome.action == "dead"
    assert (landed["Body"], landed["MessageAttributes"]) == ("fail-a1", attributes_of("o-1"))
    assert landed["Attributes"]["MessageGroupId"] == "a"
    assert landed["Attributes"]["MessageDeduplicationId"] not in ("", None)


def test_a_dead_letter_the_dead_letter_queue_refuses_stays_in_the_queue(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url, dead_letters = queue_with_dead_letters(sqs)
    consumer = consumer_of(Handler(), max_attempts=1)
    worker = SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=0, dead_letter="queue")
    assert worker.run_once() == []  # the first batch found the dead-letter queue
    sqs.delete_queue(QueueUrl=dead_letters)  # then it went away
    send(sqs, queue_url, "fail-1")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        [outcome] = worker.run_once()

    assert outcome.action == "dead"
    assert in_queue(sqs, queue_url) == (0, 1)  # not deleted: back after its visibility timeout
    assert "could not send to the dead-letter queue" in caplog.text


# -- a queue without a dead-letter queue -------------------------------------------------------


@pytest.mark.parametrize("dead_letter", ["queue", "leave"])
def test_a_queue_without_a_redrive_policy_is_refused_at_start_up(
    sqs: Any, dead_letter: DeadLetter
) -> None:
    queue_url = new_queue(sqs)
    send(sqs, queue_url, "order-1")
    handler = Handler()
    worker = SQSWorker(consumer_of(handler), queue_url, client=sqs, dead_letter=dead_letter)

    with pytest.raises(NoDeadLetterQueueError) as refused:
        worker.run_once()

    assert str(refused.value) == (
        f'SQSWorker(dead_letter="{dead_letter}") on {queue_url}: the queue has no '
        "RedrivePolicy; give the queue a RedrivePolicy naming an existing dead-letter queue "
        '(deadLetterTargetArn, maxReceiveCount), or pass dead_letter="delete" and keep dead '
        "messages in on_exhausted"
    )
    assert handler.runs == [] and in_queue(sqs, queue_url) == (1, 0)  # nothing received


def test_run_stops_on_a_queue_without_a_redrive_policy_instead_of_retrying(sqs: Any) -> None:
    worker = SQSWorker(consumer_of(Handler()), new_queue(sqs), client=sqs, dead_letter="queue")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(threading.Event())
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)

    assert not thread.is_alive()
    assert [type(error) for error in raised] == [NoDeadLetterQueueError]


def test_a_redrive_policy_naming_a_deleted_queue_is_refused_at_start_up(sqs: Any) -> None:
    queue_url, dead_letters = queue_with_dead_letters(sqs)
    sqs.delete_queue(QueueUrl=dead_letters)
    worker = SQSWorker(consumer_of(Handler()), queue_url, client=sqs, dead_letter="queue")

    with pytest.raises(NoDeadLetterQueueError, match="which does not exist; give the queue"):
        worker.run_once()


# -- warnings ----------------------------------------------------------------------------------


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == 30]


def test_deleting_dead_letters_a_dead_letter_queue_would_keep_is_warned_about(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url, _ = queue_with_dead_letters(sqs, max_receive_count=5)
    consumer = consumer_of(
        Handler(), on_exhausted=None, ttl_seconds=86_400, max_attempts=5, lock_timeout_seconds=29
    )

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=0).run_once()

    [warning] = warnings_of(caplog)
    assert "a dead message is deleted and the consumer has no on_exhausted" in warning
    assert 'pass dead_letter="queue"' in warning


def test_leaving_dead_letters_before_max_receive_count_is_warned_about(
    sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue_url, _ = queue_with_dead_letters(sqs, max_receive_count=5)
    consumer = consumer_of(Handler(), ttl_seconds=86_400, max_attempts=3, lock_timeout_seconds=29)
    worker = SQSWorker(consumer, queue_url, client=sqs, wait_time_seconds=0, dead_letter="leave")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        worker.run_once()

    [warning] = warnings_of(caplog)
    assert "given up at delivery 3 (max_attempts) is received again" in warning
    assert "set max_attempts to 5" in warning


# -- the page's redrive steps, end to end ------------------------------------------------------


def shown_section(name: str, section: str) -> str:
    """The code a page shows of a snippet file: its ``section``."""
    text = (SNIPPETS / name).read_text()
    start = text.index(f"# --8<-- [start:{section}]\n")
    return text[start : text.index(f"# --8<-- [end:{section}]")]


def page_commands() -> list[tuple[list[str], list[str]]]:
    """The redrive commands the page shows, each with the output lines shown under it."""
    commands: list[tuple[list[str], list[str]]] = []
    for line in (SNIPPETS / "consumers-redrive.txt").read_text().splitlines():
        if line.startswith("$ "):
            commands.append((shlex.split(line.removeprefix("$ ")), []))
        else:
            commands[-1][1].append(line)
    return commands


def run_command(words: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert words[0] == "idempotency-middleware", words
    return subprocess.run(
        [sys.executable, "-m", "idempotency_middleware", *words[1:]],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start_move_task(sqs: Any, moto_endpoint: str, source_arn: str) -> bool:
    """Step 5 as the page gives it first: SQS's move task; ``False`` where it is refused."""
    once = boto3.client(
        "sqs",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        config=Config(retries={"total_max_attempts": 1}),
    )
    try:
        once.start_message_move_task(SourceArn=source_arn)
    except ClientError:
        return False
    finally:
        once.close()
    return True


@pytest.mark.parametrize("dead_letter", ["queue", "leave"])
def test_the_pages_redrive_steps_bring_dead_letters_back_to_be_handled_once(
    sqs: Any,
    moto_endpoint: str,
    dead_letter: DeadLetter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # where the page's commands run: the key file, the SQLite file
    queue_url, dead_letters = queue_with_dead_letters(sqs, max_receive_count=1)
    ledger: list[str] = []
    fixed = False

    def record_payment(message: dict[str, Any]) -> int:
        if message["Body"] == "pay 20 to bob" and not fixed:
            raise Boom("a bug, fixed by step 1")
        ledger.append(message["Body"])
        return len(ledger)

    exhausted: list[tuple[str, type[Exception]]] = []
    store = SQLiteStore(tmp_path / "payments.sqlite3")
    consumer = IdempotentConsumer(
        record_payment,
        store=store,
        key=message_key,
        name="payments.record",
        max_attempts=1,
        ttl_seconds=86_400,
        on_exhausted=lambda message, error: exhausted.append((message["Body"], type(error))),
    )
    worker = SQSWorker(
        consumer, queue_url, client=sqs, wait_time_seconds=0, dead_letter=dead_letter
    )
    send(sqs, queue_url, "pay 30 to carol", key="payment-3")
    assert [outcome.action for outcome in worker.run_once()] == ["ack"]
    # A payment whose handler fails, and a producer reusing payment-3's key for another.
    send(sqs, queue_url, "pay 20 to bob", key="payment-2")
    send(sqs, queue_url, "pay 35 to carol", key="payment-3")

    settle_until(worker, lambda: in_queue(sqs, dead_letters) == (2, 0))

    landed = {
        (message["Body"], json.dumps(message["MessageAttributes"], sort_keys=True))
        for message in peek(sqs, dead_letters)
    }
    assert landed == {
        ("pay 20 to bob", json.dumps(attributes_of("payment-2"), sort_keys=True)),
        ("pay 35 to carol", json.dumps(attributes_of("payment-3"), sort_keys=True)),
    }
    assert ("pay 20 to bob", Boom) in exhausted and ("pay 35 to carol", KeyReusedError) in exhausted
    assert in_queue(sqs, queue_url) == (0, 0)

    # 1. Deploy the fix.
    fixed = True
    # 2. Collect the dead letters' keys in a file (the page's code, as shown).
    # As a deployed job runs it: AWS settings and the queues' URLs from the environment.
    for name, value in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "DEAD_LETTER_QUEUE_URL": dead_letters,
        "QUEUE_URL": queue_url,
    }.items():
        monkeypatch.setenv(name, value)
    exec(shown_section("consumers-redrive.py", "keys"), {"__name__": "__main__"})
    assert sorted((tmp_path / "dead-letter-keys.txt").read_text().split()) == [
        "payment-2",
        "payment-3",
    ]
    # 3. and 4. show one key, then delete them all: the page's commands, as written.
    (show, _), (delete, deleted) = page_commands()[:2]
    shown = run_command(show, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "completed"  # pay 30 to carol's
    result = run_command(delete, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == deleted  # payment-2 was released when it went dead
    # 5. Start the redrive: SQS's move task, else the page's move by hand.
    [(move_task, _)] = page_commands()[2:]
    assert move_task[:3] == ["aws", "sqs", "start-message-move-task"]
    if not start_move_task(sqs, moto_endpoint, queue_arn(sqs, dead_letters)):
        exec(shown_section("consumers-redrive.py", "move"), {"__name__": "__main__"})

    settle_until(worker, lambda: len(ledger) == 3 and in_queue(sqs, queue_url) == (0, 0))

    assert ledger[0] == "pay 30 to carol"
    assert sorted(ledger[1:]) == ["pay 20 to bob", "pay 35 to carol"]  # each once
    assert in_queue(sqs, dead_letters) == (0, 0)
    assert worker.run_once() == []
    store.close()
