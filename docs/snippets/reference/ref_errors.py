"""The API reference's examples for errors: each raised as a caller meets it."""

# --8<-- [start:idempotent-errors]
from idempotency_middleware import (
    IdempotencyError,
    InvalidKeyError,
    KeyInProgressError,
    KeyReusedError,
    MemoryStore,
    SQLiteStore,
    StoreUnavailableError,
    idempotent,
)


@idempotent(store=MemoryStore(), key=lambda order: order["id"])
def place(order: dict[str, str]) -> str:
    if order.get("again"):
        return place(order)  # the same key while the first call runs
    return order["id"]


place({"id": "1"})
for order, error in [
    ({"id": "1", "item": "pen"}, KeyReusedError),  # the key, another payload
    ({"id": "2", "again": "yes"}, KeyInProgressError),  # a duplicate still running
    ({"id": ""}, InvalidKeyError),  # no key
]:
    try:
        place(order)
    except error as caught:
        assert isinstance(caught, IdempotencyError)


@idempotent(store=SQLiteStore("/nonexistent/idempotency.sqlite3"), key="order_id")
def ship(order_id: str) -> str:
    return order_id


try:
    ship("1")  # the store cannot answer: the function does not run
except StoreUnavailableError as error:
    print(error)
# --8<-- [end:idempotent-errors]

# --8<-- [start:action-errors]
import datetime

from idempotency_middleware import (
    ActionAlreadyUsedError,
    ActionCanceledError,
    ActionError,
    ActionExistsError,
    ActionExpiredError,
    ActionLockedError,
    ActionNotActiveError,
    ActionNotFoundError,
    InvalidPinError,
    MemoryStore,
    OneTimeActions,
)
from idempotency_middleware.testing import FakeClock

clock = FakeClock()
actions = OneTimeActions(MemoryStore(clock=clock))
now = datetime.datetime.fromtimestamp(clock.now(), datetime.timezone.utc)
used = actions.create(expires_in=60)
actions.consume(used.action_id)
canceled = actions.create(expires_in=60)
actions.cancel(canceled.action_id)
later = actions.create(expires_in=60, active_at=now + datetime.timedelta(seconds=30))
pinned = actions.create(expires_in=60, pin="4821", max_pin_attempts=1)
expiring = actions.create(expires_in=600)

for consume, error in [
    (lambda: actions.consume(used.action_id), ActionAlreadyUsedError),
    (lambda: actions.consume(canceled.action_id), ActionCanceledError),
    (lambda: actions.consume(later.action_id), ActionNotActiveError),
    (lambda: actions.consume("no-such-id"), ActionNotFoundError),
    (lambda: actions.consume(pinned.action_id, pin="0000"), InvalidPinError),
    (lambda: actions.consume(pinned.action_id, pin="4821"), ActionLockedError),
    (lambda: actions.create(expires_in=60, action_id=used.action_id), ActionExistsError),
    (lambda: (clock.advance(601), actions.consume(expiring.action_id)), ActionExpiredError),
]:
    try:
        consume()
    except error as caught:
        assert isinstance(caught, ActionError)
        print(type(caught).__name__, caught.status, caught.problem()["title"])
    else:
        raise AssertionError(f"{error.__name__} not raised")
# --8<-- [end:action-errors]
