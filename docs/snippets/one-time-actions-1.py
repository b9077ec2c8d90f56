# --8<-- [start:show]
from datetime import datetime, timezone

from idempotency_middleware import ActionAlreadyUsedError, OneTimeActions, SQLiteStore


def send_email(url: str) -> None:
    print("email:", url)  # your mailer


def log_in(user_id: int) -> None:
    print("logged in:", user_id)  # your sessions


actions = OneTimeActions(SQLiteStore("idempotency.sqlite3"))

link = actions.create(expires_in=900, data={"user_id": 42})  # a magic link, 15 minutes
send_email(f"https://example.com/login/{link.action_id}")

try:
    used = actions.consume(link.action_id, reason="login from 203.0.113.7")
    log_in(used.data["user_id"])
except ActionAlreadyUsedError as error:
    print("this link was already used at", error.consumed_at)

# A coupon with a code of your own, valid from Monday, guarded by a PIN (5 tries).
monday = datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc)
actions.create(expires_in=14 * 86400, active_at=monday, pin="4821", action_id="XMAS-2026-0001")
# From Monday on: actions.consume("XMAS-2026-0001", pin="4821", reason="order 1017")

invite = actions.create(expires_in=86400)
actions.cancel(invite.action_id)  # pending or active -> canceled
actions.get(invite.action_id)  # the Action as it stands (state "canceled"), or None
# --8<-- [end:show]
# The link works once: a second consume is refused.
try:
    actions.consume(link.action_id)
except ActionAlreadyUsedError:
    pass
else:
    raise AssertionError("a link consumed twice")
canceled = actions.get(invite.action_id)
assert canceled is not None and canceled.state == "canceled"
