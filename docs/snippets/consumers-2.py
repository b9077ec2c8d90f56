"""The consumers page's sizing example: TTL and lock timeout from the queue's settings."""

# --8<-- [start:show]
from idempotency_middleware import IdempotentConsumer, SQLiteStore


def charge(message: dict[str, str]) -> None:
    """Charges the card of the payment in ``message``."""


store = SQLiteStore("payments-idempotency.sqlite3")
VISIBILITY_TIMEOUT = 300  # the queue's VisibilityTimeout, in seconds
MAX_RECEIVE_COUNT = 5  # its redrive policy's maxReceiveCount
MARGIN = 3600  # delays, backlogs, a message held by a slow consumer

consumer = IdempotentConsumer(
    charge,
    store=store,
    key=lambda message: message["messageId"],
    name="payments.charge",
    # A completed key must outlive every redelivery SQS may still make of its message.
    ttl_seconds=VISIBILITY_TIMEOUT * MAX_RECEIVE_COUNT + MARGIN,
    # A dead consumer's claim is free again (lock plus the 1 s clock skew margin) by the time
    # SQS redelivers its message; a live handler's lease is renewed while it runs.
    lock_timeout_seconds=VISIBILITY_TIMEOUT - 10,
    max_attempts=MAX_RECEIVE_COUNT,
)
# --8<-- [end:show]
assert consumer.process({"messageId": "m-1", "body": "{}"}).action == "ack"
# SQSWorker(dead_letter="queue") finds nothing to warn about on such a queue.
from idempotency_middleware.consumers.sqs_worker import fit_warnings

assert fit_warnings(consumer, VISIBILITY_TIMEOUT, MAX_RECEIVE_COUNT, "queue") == []
assert len(fit_warnings(consumer, VISIBILITY_TIMEOUT - 60, MAX_RECEIVE_COUNT * 4, "queue")) == 2
