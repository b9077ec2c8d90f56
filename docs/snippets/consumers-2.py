"""The consumers page's sizing example: TTL and lock timeout from the queue's settings."""

from idempotency_middleware import IdempotentConsumer, MemoryStore


def charge(message: dict[str, str]) -> None:
    return None


store = MemoryStore()
# --8<-- [start:show]
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
    # A dead consumer's claim is free again by the time SQS redelivers its message; a live
    # handler's lease is renewed while it runs, however long that is.
    lock_timeout_seconds=VISIBILITY_TIMEOUT,
    max_attempts=MAX_RECEIVE_COUNT,
)
# --8<-- [end:show]
assert consumer.process({"messageId": "m-1", "body": "{}"}).action == "ack"
