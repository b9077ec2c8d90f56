from celery import Celery

from idempotency_middleware import SQLiteStore
from idempotency_middleware.celery import idempotent_task

app = Celery("billing", broker="redis://localhost:6379/0")
store = SQLiteStore("idempotency.sqlite3")
store.check()  # a store that cannot work fails here, not at the first task


@idempotent_task(app, store=store, max_attempts=5)
def charge(order_id: str) -> dict:
    # Once per task id (or Idempotency-Key header); a failure retried, then rejected.
    return {"charged": order_id}
