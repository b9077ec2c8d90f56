"""The API reference's examples for one-time actions."""

# --8<-- [start:OneTimeActions]
from idempotency_middleware import ActionState, MemoryStore, OneTimeActions

actions = OneTimeActions(MemoryStore())
link = actions.create(expires_in=900, data={"user_id": 42})  # a magic link, 15 minutes
used = actions.consume(link.action_id, reason="login")
assert used.state is ActionState.CONSUMED and used.data == {"user_id": 42}
# --8<-- [end:OneTimeActions]

# --8<-- [start:Action]
from idempotency_middleware import MemoryStore, OneTimeActions

actions = OneTimeActions(MemoryStore())
link = actions.create(expires_in=900, data={"user_id": 42})
actions.consume(link.action_id, reason="login")
action = actions.get(link.action_id)  # the Action as it stands, or None
assert action is not None and action.consumed_reason == "login"
print(action.to_dict())  # JSON-ready: no PIN, no hash
# --8<-- [end:Action]
