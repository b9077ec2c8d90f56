"""``SQSWorker``: an ``IdempotentConsumer`` polling an SQS queue, and telling SQS each verdict.

One batch at a time: receive (long polling), run the consumer over each message in order,
then settle the batch with as few calls as SQS allows: ``ack`` messages are deleted
(``DeleteMessageBatch``), ``dead`` ones go where ``dead_letter`` says (``sqs_dead_letters``),
``retry`` messages with a known ``retry_after`` are made visible again then
(``ChangeMessageVisibilityBatch``), other ``retry`` messages are left to their visibility
timeout. While the batch runs, a heartbeat thread extends the visibility of
its unsettled messages every half visibility timeout, so SQS does not hand a message whose
handler is slow (or that waits behind one) to another consumer meanwhile.

An ``async def`` consumer runs on the worker's own event loop, made on first use and kept
(async store clients bound to it stay usable) until ``close()``. That loop runs in a thread
of its own, so what an attempt leaves running in the background (the release of a claim
whose answer was lost) goes on between batches, not only while the next batch runs;
``close()`` gives such work ``close_timeout`` seconds to finish, cancels the rest, then
ends the loop and its thread. boto3 is imported only when the worker makes its own client.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import math
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from ..policy.options import named_options
from .consumer import IdempotentConsumer, Outcome
from .sqs_dead_letters import (
    DeadLetter,
    NoDeadLetterQueueError,
    check_dead_letter,
    dead_letter_entry,
    dead_letter_target,
    is_no_such_queue,
    missing,
    queue_name_and_account,
)

logger = logging.getLogger(__name__)

# SQS's own limits: a batch call takes 10 entries; a visibility timeout is at most 12 hours.
BATCH_LIMIT = 10
MAX_VISIBILITY_TIMEOUT = 43_200
MAX_WAIT_TIME_SECONDS = 20
# After a failed receive, run() waits this long before polling again.
RECEIVE_ERROR_PAUSE_SECONDS = 1.0
# Beyond the last receive SQS may make of a message, how much longer its completed key is to
# be kept: a backlog of visible messages no worker receives meanwhile.
TTL_MARGIN_SECONDS = 3600
# How long close() lets the loop's background work (lost claims' releases) finish before
# cancelling it: a claim left unreleased is only held until its lock timeout.
CLOSE_TIMEOUT_SECONDS = 5.0
UNWIND_SECONDS = 1.0  # then how long cancelled tasks get to unwind (a bound, should one hang)

Message = dict[str, Any]  # one message as boto3's receive_message returns it
T = TypeVar("T")


def _check_int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int from {low} to {high}, got {value!r}")
    return value


def _sqs_client() -> Any:
    """boto3's SQS client, or ``ModuleNotFoundError`` naming the extra that installs it."""
    try:
        found = importlib.util.find_spec("boto3") is not None
    except ImportError:  # an import hook refusing it
        found = False
    if not found:
        raise ModuleNotFoundError(
            "SQSWorker needs boto3, which is not installed: "
            'pip install "idempotency-middleware[sqs]" (or pass client=)',
            name="boto3",
        )
    import boto3

    return boto3.client("sqs")


def delivery_count(message: Mapping[str, Any]) -> int | None:
    """SQS's ``ApproximateReceiveCount`` of a received message, or ``None`` when absent."""
    try:
        return int(message["Attributes"]["ApproximateReceiveCount"])
    except (KeyError, TypeError, ValueError):
        return None


class SQSWorker:
    """Polls ``queue_url`` and runs ``consumer`` over each message, telling SQS each verdict.

    ``client`` is a boto3 SQS client (default: ``boto3.client("sqs")``). ``max_messages``
    (1-10) and ``wait_time_seconds`` (0-20, long polling) go to each ``ReceiveMessage``.
    ``visibility_timeout`` (seconds) is asked for on each receive; ``None`` uses the queue's
    ``VisibilityTimeout`` attribute, read once. The handler gets boto3's message dict, with
    its ``Attributes`` (``ApproximateReceiveCount``, ``MessageGroupId``...) and
    ``MessageAttributes``. In a FIFO queue, once a message of a group is to be retried, the
    group's later messages of the batch do not run and are made visible again at once, so
    SQS delivers the group in order. The first batch reads the queue's attributes and logs a
    warning for each consumer option that does not fit them (``fit_warnings``).

    ``dead_letter`` says where a ``dead`` message goes: ``"delete"`` (the default) deletes it,
    ``"queue"`` sends it to the queue's dead-letter queue (its ``RedrivePolicy``'s
    ``deadLetterTargetArn``) with its body and message attributes, then deletes it;
    ``"leave"`` makes it visible again at once, for SQS to move there past
    ``maxReceiveCount``. The last two raise ``NoDeadLetterQueueError`` at the first batch on a
    queue without a redrive policy.
    """

    @named_options("SQSWorker")
    def __init__(
        self,
        consumer: IdempotentConsumer,
        queue_url: str,
        *,
        client: Any = None,
        max_messages: int = 10,
        wait_time_seconds: int = 20,
        visibility_timeout: int | None = None,
        dead_letter: DeadLetter = "delete",
    ) -> None:
        if not isinstance(consumer, IdempotentConsumer):
            raise TypeError(f"SQSWorker takes an IdempotentConsumer, got {consumer!r}")
        if not (isinstance(queue_url, str) and queue_url):
            raise ValueError(f"queue_url must be the queue's URL (a str), got {queue_url!r}")
        self.consumer = consumer
        self.queue_url = queue_url
        self.max_messages = _check_int(max_messages, "max_messages", 1, BATCH_LIMIT)
        self.wait_time_seconds = _check_int(
            wait_time_seconds, "wait_time_seconds", 0, MAX_WAIT_TIME_SECONDS
        )
        if visibility_timeout is not None:
            # 0 would leave nothing to extend: each message visible again as it is received.
            _check_int(visibility_timeout, "visibility_timeout", 1, MAX_VISIBILITY_TIMEOUT)
        self._visibility_timeout = visibility_timeout
        self.dead_letter: DeadLetter = check_dead_letter(dead_letter)
        self._max_receive_count: int | None = None
        self._dead_letter_arn: str | None = None
        self._dead_letter_url: str | None = None  # "queue": resolved at the first batch
        self._checked = False
        self._own_client = client is None
        self.client: Any = _sqs_client() if client is None else client
        self._loop: _LoopThread | None = None

    def __repr__(self) -> str:
        return f"SQSWorker({self.consumer.name!r}, {self.queue_url!r})"

    def __enter__(self) -> SQSWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, close_timeout: float | None = None) -> None:
        """End the worker's event loop (async consumers) and the client it made. Background
        work still running on the loop gets ``close_timeout`` seconds (default
        ``CLOSE_TIMEOUT_SECONDS``, 5), then is cancelled."""
        if self._loop is not None:
            self._loop.close(CLOSE_TIMEOUT_SECONDS if close_timeout is None else close_timeout)
            self._loop = None
        if self._own_client:
            self.client.close()

    @property
    def visibility_timeout(self) -> int:
        """The worker's ``visibility_timeout``, else the queue's (read once)."""
        if self._visibility_timeout is None:
            self._read_queue()
        assert self._visibility_timeout is not None
        return self._visibility_timeout

    def _read_queue(self) -> None:
        """Read the queue's visibility timeout and redrive policy."""
        attributes = self.client.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout", "RedrivePolicy"]
        )["Attributes"]
        if self._visibility_timeout is None:
            self._visibility_timeout = int(attributes["VisibilityTimeout"])
        self._max_receive_count = max_receive_count(attributes.get("RedrivePolicy"))
        self._dead_letter_arn = dead_letter_target(attributes.get("RedrivePolicy"))

    def _check_queue(self) -> None:
        """Find the dead-letter queue ``dead_letter`` needs, and warn, once, about consumer
        options that do not fit the queue's timeouts. A worker given its visibility timeout
        and deleting dead messages may lack ``sqs:GetQueueAttributes``: then it cannot tell
        the redrive policy, and says so at DEBUG."""
        try:
            self._read_queue()
        except Exception as error:
            if self._visibility_timeout is None or self.dead_letter != "delete":
                raise
            logger.debug("SQS worker on %s: no redrive policy read: %r", self.queue_url, error)
        if self.dead_letter != "delete":
            self._find_dead_letter_queue()
        self._checked = True
        timeout, receives = self.visibility_timeout, self._max_receive_count
        for warning in fit_warnings(self.consumer, timeout, receives, self.dead_letter):
            logger.warning("SQS worker on %s: %s", self.queue_url, warning)

    def _find_dead_letter_queue(self) -> None:
        """The queue's dead-letter queue, and for ``"queue"`` its URL; else the typed error
        naming the fix (a configuration to change, not a failure to retry)."""
        arn = self._dead_letter_arn
        if arn is None or self._max_receive_count is None:
            raise missing(self.queue_url, self.dead_letter, "the queue has no RedrivePolicy")
        if self.dead_letter != "queue":
            return
        name, account = queue_name_and_account(arn)
        try:
            found = self.client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)
        except Exception as error:
            if is_no_such_queue(error):
                why = f"its RedrivePolicy names {arn}, which does not exist"
                raise missing(self.queue_url, self.dead_letter, why) from error
            raise
        self._dead_letter_url = str(found["QueueUrl"])

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Receive and process batches until ``stop`` is set (checked between batches: a
        receive waits up to ``wait_time_seconds`` first). A failed receive is logged and
        tried again after a pause; a failing handler never stops the loop. A queue without
        the dead-letter queue ``dead_letter`` needs raises ``NoDeadLetterQueueError``."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.run_once()
            except NoDeadLetterQueueError:
                raise  # a configuration to fix: retrying would only log it every second
            except Exception:
                logger.exception("SQS worker on %s: receiving failed; retrying", self.queue_url)
                stop.wait(RECEIVE_ERROR_PAUSE_SECONDS)

    def run_once(self) -> list[Outcome]:
        """Receive one batch (waiting up to ``wait_time_seconds``), process it, settle it
        with SQS; the outcomes, one per message received, in order. The first call reads
        the queue's attributes and logs a warning for each consumer option that does not
        fit them (see ``fit_warnings``)."""
        if not self._checked:
            self._check_queue()
        timeout = self.visibility_timeout
        messages: list[Message] = self.client.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.max_messages,
            WaitTimeSeconds=self.wait_time_seconds,
            VisibilityTimeout=timeout,
            # ApproximateReceiveCount (the delivery count), MessageGroupId... (Not also the
            # deprecated AttributeNames: one current parameter, as AWS's own SDKs send.)
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            return []
        heartbeat = _Heartbeat(self, messages, timeout)
        heartbeat.start()
        try:
            outcomes = self._process(messages)
        finally:
            heartbeat.stop()
        self._settle(messages, outcomes)
        return outcomes

    def _process(self, messages: list[Message]) -> list[Outcome]:
        if self.consumer.is_async:
            if self._loop is None:
                self._loop = _LoopThread(f"sqs-worker-{self.consumer.name}")
            return self._loop.run(self._aprocess(messages))
        outcomes: list[Outcome] = []
        blocked: dict[str, Outcome] = {}
        for message in messages:
            outcome = _held_back(message, blocked)
            if outcome is None:
                outcome = self.consumer.process(message, delivery_count(message))
                _block(message, outcome, blocked)
            outcomes.append(outcome)
        return outcomes

    async def _aprocess(self, messages: list[Message]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        blocked: dict[str, Outcome] = {}
        for message in messages:
            outcome = _held_back(message, blocked)
            if outcome is None:
                outcome = await self.consumer.aprocess(message, delivery_count(message))
                _block(message, outcome, blocked)
            outcomes.append(outcome)
        return outcomes

    # -- telling SQS ---------------------------------------------------------------------

    def _settle(self, messages: Sequence[Message], outcomes: Sequence[Outcome]) -> None:
        deletes: list[dict[str, Any]] = []
        visible_again: list[dict[str, Any]] = []
        dead_letters: list[dict[str, Any]] = []
        for number, (message, outcome) in enumerate(zip(messages, outcomes, strict=True)):
            entry: dict[str, Any] = {"Id": str(number), "ReceiptHandle": message["ReceiptHandle"]}
            if outcome.action == "ack" or (outcome.action, self.dead_letter) == ("dead", "delete"):
                deletes.append(entry)
            elif outcome.action == "dead" and self.dead_letter == "leave":
                # Received again at once, SQS moves it once its receive count passes
                # maxReceiveCount (each receive before that goes through the consumer).
                visible_again.append({**entry, "VisibilityTimeout": 0})
            elif outcome.action == "dead":
                dead_letters.append(message)
            elif outcome.retry_after is not None:
                seconds = min(max(math.ceil(outcome.retry_after), 0), MAX_VISIBILITY_TIMEOUT)
                visible_again.append({**entry, "VisibilityTimeout": seconds})
        if dead_letters:
            deletes += self._send_dead_letters(dead_letters)
        if deletes:
            self._batch("delete_message_batch", deletes, "delete")
        if visible_again:
            self._batch("change_message_visibility_batch", visible_again, "put back")

    def _send_dead_letters(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """Copy ``messages`` to the dead-letter queue; the delete entries of those it took.
        One it refused stays in the queue (visible again after its visibility timeout): a
        dead message is never deleted before its copy landed."""
        url = self._dead_letter_url
        assert url is not None  # found by the first batch's check
        fifo = url.endswith(".fifo")
        entries = [dead_letter_entry(str(n), m, fifo=fifo) for n, m in enumerate(messages)]
        sent = self._batch("send_message_batch", entries, "send to the dead-letter queue", url)
        return [
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
            for n, m in enumerate(messages)
            if str(n) in sent
        ]

    def _extend(self, messages: Sequence[Message], seconds: int) -> None:
        """Make ``messages`` invisible for ``seconds`` more, from now (the heartbeat)."""
        self._batch(
            "change_message_visibility_batch",
            [
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": seconds}
                for n, m in enumerate(messages)
            ],
            "extend the visibility of",
        )

    def _batch(
        self,
        operation: str,
        entries: list[dict[str, Any]],
        doing: str,
        queue_url: str | None = None,
    ) -> set[str]:
        """One batch call per 10 entries (to ``queue_url``, default the worker's queue); the
        ``Id`` of each entry SQS took. Failures are logged, never raised: an acked message
        not deleted comes back and is replayed (its key completed); one not put back or not
        extended comes back after its visibility timeout."""
        call = getattr(self.client, operation)
        done: set[str] = set()
        for start in range(0, len(entries), BATCH_LIMIT):
            chunk = entries[start : start + BATCH_LIMIT]
            try:
                failed = call(QueueUrl=queue_url or self.queue_url, Entries=chunk).get("Failed", [])
            except Exception as error:
                logger.warning(
                    "SQS worker on %s: could not %s %d message(s): %r",
                    self.queue_url,
                    doing,
                    len(chunk),
                    error,
                )
                continue
            refused = {failure.get("Id") for failure in failed}
            done.update(entry["Id"] for entry in chunk if entry["Id"] not in refused)
            for failure in failed:
                logger.warning(
                    "SQS worker on %s: could not %s message %s: %s %s",
                    self.queue_url,
                    doing,
                    failure.get("Id"),
                    failure.get("Code"),
                    failure.get("Message", ""),
                )
        return done


def max_receive_count(redrive_policy: object) -> int | None:
    """The ``maxReceiveCount`` of a queue's ``RedrivePolicy`` attribute (a JSON string), or
    ``None`` without one."""
    try:
        return int(json.loads(str(redrive_policy))["maxReceiveCount"])
    except (KeyError, TypeError, ValueError):
        return None


def fit_warnings(
    consumer: IdempotentConsumer,
    visibility_timeout: int,
    max_receive_count: int | None,
    dead_letter: DeadLetter = "delete",
) -> list[str]:
    """What in ``consumer``'s options does not fit an SQS queue with this visibility timeout
    and redrive policy (``max_receive_count``, ``None`` without one), for a worker with this
    ``dead_letter``; one sentence each."""
    warnings: list[str] = []
    takeover = consumer.lock_timeout_seconds + consumer.clock_skew_seconds
    if takeover > visibility_timeout:
        warnings.append(
            f"the consumer's lock timeout ({consumer.lock_timeout_seconds:g} s) plus its clock "
            f"skew margin ({consumer.clock_skew_seconds:g} s) outlasts the visibility timeout "
            f"({visibility_timeout} s): a message redelivered after a worker died finds the "
            "dead worker's claim still locked and is put back until it is free, one more "
            "receive counted against maxReceiveCount; set lock_timeout_seconds to at most "
            f"{max(visibility_timeout - consumer.clock_skew_seconds, 0):g} (the lease renews "
            "it while a handler runs, however long)"
        )
    if max_receive_count is None:
        return warnings
    horizon = visibility_timeout * max_receive_count
    if consumer.ttl_seconds < horizon + TTL_MARGIN_SECONDS:
        warnings.append(
            f"the consumer's ttl_seconds ({consumer.ttl_seconds:g}) does not outlive the "
            f"queue's redelivery horizon, the visibility timeout ({visibility_timeout} s) times "
            f"maxReceiveCount ({max_receive_count}) plus {TTL_MARGIN_SECONDS} s for backlogs: "
            "a message redelivered after its key expired runs its handler again; set "
            f"ttl_seconds to at least {horizon + TTL_MARGIN_SECONDS}"
        )
    if consumer.max_attempts is not None and consumer.max_attempts > max_receive_count:
        warnings.append(
            f"the consumer's max_attempts ({consumer.max_attempts}) is above the queue's "
            f"maxReceiveCount ({max_receive_count}): SQS moves a failing message to its "
            "dead-letter queue before the consumer gives up on it, so on_exhausted is never "
            f"called; set max_attempts to at most {max_receive_count}"
        )
    if dead_letter == "delete" and consumer.on_exhausted is None:
        warnings.append(
            "the queue has a dead-letter queue, but a dead message is deleted and the "
            "consumer has no on_exhausted to keep it: it is lost; pass "
            'dead_letter="queue" to send it to the dead-letter queue'
        )
    if (
        dead_letter == "leave"
        and consumer.max_attempts is not None
        and consumer.max_attempts < max_receive_count
    ):
        warnings.append(
            f'with dead_letter="leave", a message given up at delivery {consumer.max_attempts} '
            f"(max_attempts) is received again until SQS moves it past maxReceiveCount "
            f"({max_receive_count}), its handler run and on_exhausted called on each receive; "
            f"set max_attempts to {max_receive_count}"
        )
    return warnings


def _group(message: Mapping[str, Any]) -> str | None:
    group = message.get("Attributes", {}).get("MessageGroupId")
    return str(group) if group is not None else None


def _held_back(message: Message, blocked: Mapping[str, Outcome]) -> Outcome | None:
    """A FIFO message behind a retried one of its group: not run, visible again at once."""
    group = _group(message)
    if group is None or group not in blocked:
        return None
    return Outcome("retry", error=blocked[group].error, retry_after=0)


def _block(message: Message, outcome: Outcome, blocked: dict[str, Outcome]) -> None:
    group = _group(message)
    if group is not None and outcome.action == "retry":
        blocked[group] = outcome


class _LoopThread:
    """An event loop running in a thread of its own until ``close()``.

    Between batches the loop keeps running, so background tasks the batches spawned go on
    (draining them at the end of each batch instead would hold the next receive for as long
    as the slowest: a lost claim's release retries for seconds).
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop; its result, or what it raised, here."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # (interrupted here: the batch does not go on without us)
            raise

    def close(self, timeout: float) -> None:
        try:
            self.run(_finish_tasks(timeout))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


async def _finish_tasks(timeout: float) -> None:
    """Let the loop's other tasks finish within ``timeout`` seconds, cancel the rest and
    wait for them to unwind; then close its async generators."""
    loop = asyncio.get_running_loop()
    tasks = asyncio.all_tasks(loop) - {asyncio.current_task(loop)}
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=UNWIND_SECONDS)
    await loop.shutdown_asyncgens()
    # The threads a handler's to_thread started: a hung one cannot be stopped, and close()
    # must not wait on it for ever (before Python 3.12 this shutdown has no timeout).
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(loop.shutdown_default_executor(), UNWIND_SECONDS)


class _Heartbeat:
    """Extends a batch's visibility every half timeout until stopped (its own thread)."""

    def __init__(self, worker: SQSWorker, messages: Sequence[Message], timeout: int) -> None:
        self._worker = worker
        self._messages = messages
        self._timeout = timeout
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"sqs-heartbeat-{worker.consumer.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stopped.wait(self._timeout / 2):
            self._worker._extend(self._messages, self._timeout)


__all__ = ["SQSWorker", "delivery_count"]
