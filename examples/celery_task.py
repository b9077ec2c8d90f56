"""A Celery-style task that emails each receipt once, however often it is delivered.

Celery delivers a task again when its worker dies before acknowledging it (``acks_late``),
and a retry keeps the task's id; a producer that may send twice names the task itself
(``apply_async((order_id,), task_id=f"receipt-{order_id}")``). Keyed by the task id, a
second delivery of a completed task returns the first one's result and sends nothing.

No Celery needed to run this: ``send_receipt`` is the task's body. With Celery,
``idempotency_middleware.celery.idempotent_task`` registers such a task and maps its verdicts
to Celery's retry and reject (the Message consumers page); or a thin task hands it the id::

    @app.task(bind=True, acks_late=True, autoretry_for=(KeyInProgressError,))
    def send_receipt_task(self, order_id):
        return send_receipt(self.request.id, order_id)

    python -m examples.celery_task
"""

from __future__ import annotations

import os

from idempotency_middleware import SQLiteStore, idempotent

# One file shared by the worker processes of a machine (Celery's prefork pool); use
# DynamoDBStore(table) when the workers run on several machines.
store = SQLiteStore(os.environ.get("RECEIPTS_IDEMPOTENCY_DB", "receipts-idempotency.sqlite3"))

# Stands in for the side effect: the emails sent, as (order, receipt number).
outbox: list[tuple[str, int]] = []


@idempotent(store=store, key="task_id")
def send_receipt(task_id: str, order_id: str) -> int:
    number = len(outbox) + 1
    outbox.append((order_id, number))
    return number  # a redelivery returns this same receipt number


if __name__ == "__main__":
    print(send_receipt("receipt-order-7", "order-7"))  # sends receipt 1
    print(send_receipt("receipt-order-7", "order-7"))  # a redelivery: 1 again, nothing sent
    print(outbox)
    store.close()
