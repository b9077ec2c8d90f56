"""One-time actions on a ``RedisStore``: beside its records, under the same prefix.

An action lives in one hash at ``<store prefix>action:<id>``, which no record key (the
prefix and a hex hash) can equal. Every step is one Lua script run with ``EVALSHA`` on that
one key: atomic, one round trip, at home on Redis Cluster and Valkey. A script that does
not apply its step answers why in the same call: it returns the hash as it found it. Times
are the store clock's (sent as arguments, compared by the scripts), never the server's.
The key expires (``PEXPIREAT``) once its action is forgotten, past its retention plus the
store's ``ttl_grace_seconds``: housekeeping only, since the scripts answer an action past
its retention as absent whatever the server's clock says. Scripts go through the store's
own transport (its sync client, or the running loop's asyncio client): errors
become ``StoreUnavailable`` and count on its breaker, as for its records.

Hash layout (times are epoch seconds, as Python's shortest round-trip text)::

    created_at       active_at       expires_at
    purge_at         when the action is forgotten (its expiry plus the retention)
    data             the caller's JSON
    pin_hash         scrypt$n$r$p$<base64> (absent without a PIN)
    attempts_left    (absent without a PIN)
    consumed_at      consumed_reason     canceled_at     (absent until set)
    created_by       the create's nonce
    consumed_by      the consume's nonce (absent until consumed)
"""

from __future__ import annotations

import math
from typing import Any

from ..stores.kit import Flow
from ..stores.redis import RedisStore
from ..stores.redis.ops import Script, pairs, seconds
from .model import ActionRecord
from .steps import Cancel, Consume, Insert, Read, SpendAttempt, Step, Written

KEY_INFIX = "action:"

# Each script answers {1, the hash after the write} or {0, the hash as it was found}.
_REFUSE = "return {0, redis.call('HGETALL', KEYS[1])}"

# ARGV[1] is the step's time. Open: present, neither consumed nor canceled, not expired
# (ActionRecord.is_open).
_OPEN = """
local now = tonumber(ARGV[1])
local old = redis.call('HMGET', KEYS[1], 'expires_at', 'consumed_at', 'canceled_at',
  'active_at', 'pin_hash', 'attempts_left')
local open = old[1] and not old[2] and not old[3] and tonumber(old[1]) > now
"""

# ARGV: now, the key's expiry (epoch milliseconds), then the hash's fields and values.
# The id is free when absent, or when its old action is past its retention (purge_at).
INSERT = f"""
local purge_at = redis.call('HGET', KEYS[1], 'purge_at')
if purge_at and tonumber(purge_at) > tonumber(ARGV[1]) then
  {_REFUSE}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return {{1}}
"""

# ARGV: now, "1" and the PIN's hash (or "0", ""), "1" and the reason (or "0", ""), "1" and
# the consume's nonce (or "0", "").
CONSUME = f"""{_OPEN}
if not open or tonumber(old[4]) > now then
  {_REFUSE}
end
if ARGV[2] == '1' then
  if old[5] ~= ARGV[3] or not old[6] or tonumber(old[6]) <= 0 then
    {_REFUSE}
  end
elseif old[5] then
  {_REFUSE}
end
redis.call('HSET', KEYS[1], 'consumed_at', ARGV[1])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'consumed_reason', ARGV[5])
end
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'consumed_by', ARGV[7])
end
return {{1, redis.call('HGETALL', KEYS[1])}}
"""

# Fenced by the count itself: concurrent wrong guesses each take one attempt, and none is
# taken once it reaches 0.
SPEND_ATTEMPT = f"""{_OPEN}
if not open or not old[6] or tonumber(old[6]) <= 0 then
  {_REFUSE}
end
redis.call('HINCRBY', KEYS[1], 'attempts_left', -1)
return {{1, redis.call('HGETALL', KEYS[1])}}
"""

CANCEL = f"""{_OPEN}
if not open then
  {_REFUSE}
end
redis.call('HSET', KEYS[1], 'canceled_at', ARGV[1])
return {{1, redis.call('HGETALL', KEYS[1])}}
"""

READ = "return {1, redis.call('HGETALL', KEYS[1])}"

SCRIPTS = {
    "insert": INSERT,
    "consume": CONSUME,
    "spend_attempt": SPEND_ATTEMPT,
    "cancel": CANCEL,
    "read": READ,
}
_SCRIPTS = {name: Script(text) for name, text in SCRIPTS.items()}

_TIMES = ("created_at", "active_at", "expires_at", "purge_at", "consumed_at", "canceled_at")


def _flag(value: str | None) -> list[str]:
    return ["0", ""] if value is None else ["1", value]


def to_fields(record: ActionRecord) -> list[str]:
    """The record as the hash's field and value pairs, flattened."""
    fields: list[str] = []
    for name in _TIMES:
        value = getattr(record, name)
        if value is not None:
            fields += [name, seconds(value)]
    for name in ("data", "pin_hash", "consumed_reason", "created_by", "consumed_by"):
        value = getattr(record, name)
        if value is not None:
            fields += [name, value]
    if record.attempts_left is not None:
        fields += ["attempts_left", str(record.attempts_left)]
    return fields


def from_hash(action_id: str, fields: dict[bytes, bytes]) -> ActionRecord | None:
    """The record in a hash as HGETALL returns it; ``None`` for an absent one."""
    if not fields:
        return None
    text = {name.decode(): value.decode() for name, value in fields.items()}

    def time(name: str) -> float | None:
        value = text.get(name)
        return None if value is None else float(value)

    attempts = text.get("attempts_left")
    return ActionRecord(
        action_id=action_id,
        created_at=float(text["created_at"]),
        active_at=float(text["active_at"]),
        expires_at=float(text["expires_at"]),
        purge_at=float(text["purge_at"]),
        data=text["data"],
        pin_hash=text.get("pin_hash"),
        attempts_left=None if attempts is None else int(attempts),
        consumed_at=time("consumed_at"),
        consumed_reason=text.get("consumed_reason"),
        canceled_at=time("canceled_at"),
        created_by=text.get("created_by"),
        consumed_by=text.get("consumed_by"),
    )


def script_for(step: Step, grace_seconds: float) -> tuple[str, list[str]]:
    """The script that carries out ``step``, and its arguments."""
    if isinstance(step, Read):
        return "read", []
    now = seconds(step.now)
    if isinstance(step, Insert):
        expire_at_ms = math.ceil((step.record.purge_at + grace_seconds) * 1000)
        return "insert", [now, str(expire_at_ms), *to_fields(step.record)]
    if isinstance(step, Consume):
        return "consume", [now, *_flag(step.pin_hash), *_flag(step.reason), *_flag(step.nonce)]
    if isinstance(step, SpendAttempt):
        return "spend_attempt", [now]
    assert isinstance(step, Cancel)
    return "cancel", [now]


def written(step: Step, reply: list[Any]) -> Written:
    """What a script answered, as the step's result."""
    ok = reply[0] == 1
    if ok and isinstance(step, Insert):
        return Written(True, step.record)
    return Written(ok, from_hash(step.action_id, pairs(reply[1])))


class RedisActions:
    """Steps on a ``RedisStore``, one script call each, through the store's own transport
    and breaker: ``write`` on its sync client, ``awrite`` on the running loop's asyncio
    client."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._prefix = store.prefix + KEY_INFIX

    def _flow(self, step: Step) -> tuple[str, Flow[Written]]:
        name, args = script_for(step, self._store.ttl_grace_seconds)

        def flow() -> Flow[Written]:
            reply = yield from _SCRIPTS[name].run(self._prefix + step.action_id, args)
            return written(step, reply)

        return f"action {name}", flow()

    def write(self, step: Step) -> Written:
        return self._store.run_flow(*self._flow(step))

    async def awrite(self, step: Step) -> Written:
        return await self._store.arun_flow(*self._flow(step))
