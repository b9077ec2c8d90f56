"""Where ``SQSWorker`` puts a ``dead`` message: its ``dead_letter`` option, and the pure parts.

``"delete"`` deletes it (after ``on_exhausted``); ``"queue"`` sends a copy to the queue's own
dead-letter queue (the ``deadLetterTargetArn`` of its ``RedrivePolicy``) and deletes it once
SQS accepted the copy; ``"leave"`` makes it visible again at once, undeleted, so SQS moves it
there itself when its receive count passes ``maxReceiveCount``. The last two need a redrive
policy: without one, ``NoDeadLetterQueueError`` at the worker's first batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

DeadLetter = Literal["delete", "queue", "leave"]
DEAD_LETTER_CHOICES: tuple[DeadLetter, ...] = ("delete", "queue", "leave")
# The error codes SQS (and boto3) give for a queue that does not exist.
NO_SUCH_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


class NoDeadLetterQueueError(ValueError):
    """``SQSWorker(dead_letter="queue" | "leave")`` on a queue with no dead-letter queue to
    reach: no ``RedrivePolicy``, or one naming a queue that does not exist."""


def check_dead_letter(value: object) -> DeadLetter:
    """``value`` when it is one of ``DEAD_LETTER_CHOICES``; else ``ValueError`` naming them."""
    if not isinstance(value, str) or value not in DEAD_LETTER_CHOICES:
        choices = ", ".join(repr(choice) for choice in DEAD_LETTER_CHOICES)
        raise ValueError(f"dead_letter must be one of {choices}, got {value!r}")
    return value


def dead_letter_target(redrive_policy: object) -> str | None:
    """The ``deadLetterTargetArn`` of a queue's ``RedrivePolicy`` attribute (a JSON string),
    or ``None`` without one."""
    try:
        target = json.loads(str(redrive_policy))["deadLetterTargetArn"]
    except (KeyError, TypeError, ValueError):
        return None
    return target if isinstance(target, str) and target else None


def queue_name_and_account(arn: str) -> tuple[str, str]:
    """A queue ARN's name and account (``arn:aws:sqs:REGION:ACCOUNT:NAME``)."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs" or not parts[4] or not parts[5]:
        raise NoDeadLetterQueueError(
            f"the redrive policy's deadLetterTargetArn {arn!r} is not a queue ARN"
        )
    return parts[5], parts[4]


def missing(queue_url: str, dead_letter: DeadLetter, why: str) -> NoDeadLetterQueueError:
    """The start-up error of a worker whose queue has no dead-letter queue to reach."""
    return NoDeadLetterQueueError(
        f'SQSWorker(dead_letter="{dead_letter}") on {queue_url}: {why}; give the queue a '
        "RedrivePolicy naming an existing dead-letter queue (deadLetterTargetArn, "
        'maxReceiveCount), or pass dead_letter="delete" and keep dead messages in '
        "on_exhausted"
    )


def is_no_such_queue(error: Exception) -> bool:
    """Whether boto3's ``error`` says the queue does not exist."""
    response = getattr(error, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, Mapping) else None
    return code in NO_SUCH_QUEUE_CODES


def dead_letter_entry(entry_id: str, message: Mapping[str, Any], *, fifo: bool) -> dict[str, Any]:
    """A ``SendMessageBatch`` entry copying a received message to the dead-letter queue: its
    body, its message attributes and its X-Ray trace header; to a FIFO queue its group, and
    its ``MessageId`` as the deduplication id, as SQS's own move to a FIFO dead-letter queue
    does (so a worker that dies between the send and the delete leaves one copy, and a
    message redriven and dead again is not taken for that first copy)."""
    entry: dict[str, Any] = {"Id": entry_id, "MessageBody": message["Body"]}
    if message.get("MessageAttributes"):
        entry["MessageAttributes"] = message["MessageAttributes"]
    attributes = message.get("Attributes", {})
    if "AWSTraceHeader" in attributes:
        entry["MessageSystemAttributes"] = {
            "AWSTraceHeader": {"DataType": "String", "StringValue": attributes["AWSTraceHeader"]}
        }
    if fifo:
        entry["MessageGroupId"] = attributes["MessageGroupId"]
        entry["MessageDeduplicationId"] = message["MessageId"]
    return entry


__all__ = [
    "DEAD_LETTER_CHOICES",
    "DeadLetter",
    "NoDeadLetterQueueError",
    "check_dead_letter",
    "dead_letter_entry",
    "dead_letter_target",
]
