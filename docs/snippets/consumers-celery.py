"""The consumers page's Celery example: a task that sends each receipt once. Run here with
an in-memory broker and a worker thread (tests/e2e/test_celery.py runs it on Redis)."""

# --8<-- [start:show]
import os

from celery import Celery

from idempotency_middleware import SQLiteStore
from idempotency_middleware.celery import TaskCall, idempotent_task

app = Celery("receipts", broker=os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0"))
store = SQLiteStore("receipts-idempotency.sqlite3")  # RedisStore, PostgresStore... across hosts
outbox: list[str] = []
dead_letters: list[TaskCall] = []


@idempotent_task(
    app,
    store=store,
    max_attempts=5,  # the 5th failing delivery is rejected, after on_exhausted
    on_exhausted=lambda call, error: dead_letters.append(call),
    default_retry_delay=10,  # Celery's delay before a failed task runs again
)
def send_receipt(order_id: str) -> int:
    outbox.append(order_id)
    return len(outbox)  # a redelivery returns this same receipt number


# Keyed by the task id, which Celery keeps across retries and redeliveries; a producer that
# may send twice names the operation:
#   send_receipt.apply_async(("order-7",), headers={"Idempotency-Key": "receipt-order-7"})
# --8<-- [end:show]

if __name__ == "__main__":
    from celery.contrib.testing.worker import start_worker

    app.conf.update(
        broker_url="memory://",
        result_backend="cache+memory://",
        broker_transport_options={"polling_interval": 0.01},
    )
    with start_worker(app, perform_ping_check=False, loglevel="WARNING"):
        for _ in range(2):  # sent twice: one receipt
            receipt = send_receipt.apply_async(
                ("order-7",), headers={"Idempotency-Key": "receipt-order-7"}
            ).get(timeout=10, interval=0.01)  # the in-memory result backend is polled
            assert receipt == 1, receipt
    assert outbox == ["order-7"], outbox
    store.close()
    print("ok")
