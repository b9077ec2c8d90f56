"""What ``RedisStore`` sends and how it reads the answers: one flow per operation, no I/O.

A request is a redis-py client method's name and its arguments (``("hgetall", key)``).
Each writing operation is one Lua script on exactly one key, ``prefix + key_hash`` (atomic,
fenced by the owner token, one round trip, Cluster-safe); the hash's fields, and why the
keys' TTLs are housekeeping only, are in docs/stores/redis.md. Deadlines are compared
against the request's ``now``, never the server's clock; times travel as Python's shortest
round-trip text, which Lua's ``tonumber`` parses to the same double.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from ..kit import Flow, kept_blob
from ..protocol import (
    CLAIMED,
    TAKEN_OVER,
    ClaimRequest,
    ClaimResult,
    Completion,
    DeferredToken,
    Held,
    StoreUnavailable,
)
from ..records import Record, Status, StoredResponse, record_from_fields

NOT_REPLICATED = "not_replicated"


class Replicated:
    """A request sent with ``WAIT replicas timeout_ms`` after it on the same connection (a
    write is waited for by the connection that made it); its reply is ``(reply, acks)``:
    the request's own reply and how many replicas acknowledged it in time."""

    __slots__ = ("key", "replicas", "request", "timeout_ms")

    def __init__(self, request: tuple[Any, ...], key: str, replicas: int, timeout_ms: int):
        self.request, self.key, self.replicas, self.timeout_ms = request, key, replicas, timeout_ms


class Lapse:
    """A notice yielded by a flow (no reply expected): ``operation`` on ``key_hash`` landed
    on the primary but only ``acks`` of the ``replicas`` wanted acknowledged it in time."""

    __slots__ = ("acks", "key_hash", "operation", "replicas")

    def __init__(self, operation: str, key_hash: str, acks: int, replicas: int) -> None:
        self.operation, self.key_hash, self.acks, self.replicas = (
            operation,
            key_hash,
            acks,
            replicas,
        )

    def describe(self) -> str:
        return (
            f"Redis {self.operation} of {self.key_hash!r} was acknowledged by {self.acks} of "
            f"{self.replicas} replicas in time: a failover now could lose it"
        )


class Script:
    """A Lua script on one key, run with ``EVALSHA``; loaded when the server does not know
    it (a new server, or its script cache flushed), then run once more."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        # Redis names a script by its SHA-1 (an identifier, not a security measure).
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    def run(self, key: str, args: Sequence[Any], wait: tuple[int, int] | None = None) -> Flow[Any]:
        """The script's reply; with ``wait`` (replicas, timeout in ms), ``(reply, acks)``."""
        evalsha = ("evalsha", self.sha, 1, key, *args)
        request: Any = evalsha if wait is None else Replicated(evalsha, key, *wait)
        try:
            return (yield request)
        except Exception as error:
            from redis.exceptions import NoScriptError

            if not isinstance(error, NoScriptError):
                raise
        yield ("script_load", self.text)
        return (yield request)


# Redis's largest bulk string (proto-max-bulk-len's default): a larger blob cannot be sent.
MAX_BLOB_BYTES = 512 * 1024 * 1024

# Claimed: 0 (new, or this very claim sent again), 1 (replaced a dead owner's claim).
# Held: the holding record's HGETALL, in the same round trip.
CLAIM = Script(
    """
local key = KEYS[1]
local old = redis.call('HMGET', key, 'status', 'owner', 'lock_expires_at', 'expires_at')
local taken_over = 0
if old[1] or redis.call('EXISTS', key) == 1 then
  if old[1] == 'in_progress' then
    if old[2] == ARGV[2] then return 0 end
    if (tonumber(old[3]) or math.huge) > tonumber(ARGV[5]) then
      return redis.call('HGETALL', key)
    end
    taken_over = 1
  elseif (tonumber(old[4]) or math.huge) > tonumber(ARGV[4]) then
    return redis.call('HGETALL', key)
  end
  redis.call('DEL', key)
end
redis.call('HSET', key, 'status', 'in_progress', 'fingerprint', ARGV[1], 'owner', ARGV[2],
  'lock_expires_at', ARGV[3], 'expires_at', ARGV[3], 'response_size', '0', 'too_large', '0')
redis.call('PEXPIRE', key, ARGV[6])
return taken_over
"""
)

# ARGV[8]: the channel its news is published on (``RedisOps.channel``); ARGV[2], the
# guard: "any" (a completion: the owner's record whatever its status),
# "interim" (a deferred key's interim response: over the claim still in progress only,
# and done already if the work's final response landed first), "final" (the work's final
# response by a deferral token: over a record not completed yet). ARGV[9]: the owner an
# interim response hands the key to ("" for none: done already when the key is that
# owner's and no longer in progress); ARGV[10], the blob when kept.
COMPLETE = Script(
    """
local key = KEYS[1]
local old = redis.call('HMGET', key, 'owner', 'status')
if old[1] ~= ARGV[1] then
  if ARGV[9] ~= '' and old[1] == ARGV[9] and old[2] ~= 'in_progress' then return 1 end
  return 0
end
if ARGV[2] == 'interim' and old[2] ~= 'in_progress' then return 1 end
if ARGV[2] == 'final' and old[2] == 'completed' then return 0 end
redis.call('HSET', key, 'status', ARGV[3], 'expires_at', ARGV[4], 'response_size', ARGV[5],
  'too_large', ARGV[6])
if ARGV[9] ~= '' then redis.call('HSET', key, 'owner', ARGV[9]) end
if ARGV[10] then redis.call('HSET', key, 'response', ARGV[10])
else redis.call('HDEL', key, 'response') end
redis.call('PEXPIRE', key, ARGV[7])
redis.call('PUBLISH', ARGV[8], key)
return 1
"""
)

# ARGV[3]: the news channel. ARGV[2], the guard: "in_progress" (a claim still running:
# never a final response a deferral's worker stored meanwhile) or "unfinished" (a deferral
# token: not completed).
RELEASE = Script(
    """
local key = KEYS[1]
local old = redis.call('HMGET', key, 'owner', 'status')
if old[1] ~= ARGV[1] then return 0 end
if ARGV[2] == 'in_progress' then
  if old[2] ~= 'in_progress' then return 0 end
elseif old[2] == 'completed' then
  return 0
end
redis.call('DEL', key)
redis.call('PUBLISH', ARGV[3], key)
return 1
"""
)

# The housekeeping TTL moves by as much as the lock does (from the TTL the server has), so
# a renewal needs no clock at all.
RENEW = Script(
    """
local key = KEYS[1]
local old = redis.call('HMGET', key, 'owner', 'status', 'lock_expires_at')
if old[1] ~= ARGV[1] or old[2] ~= 'in_progress' then return 0 end
redis.call('HSET', key, 'lock_expires_at', ARGV[2], 'expires_at', ARGV[2])
local ttl = redis.call('PTTL', key)
local moved = math.ceil((tonumber(ARGV[2]) - tonumber(old[3])) * 1000)
if ttl > 0 and moved > 0 then redis.call('PEXPIRE', key, ttl + moved) end
return 1
"""
)

SCRIPTS = {"claim": CLAIM, "complete": COMPLETE, "release": RELEASE, "renew": RENEW}


def seconds(value: float) -> str:
    """A time as the scripts store it: Python's shortest text that reads back exactly."""
    return repr(float(value))


def ttl_ms(deadline: float, now: float, grace_seconds: float) -> int:
    """The housekeeping TTL of a record whose deadline is ``deadline`` at ``now``: relative
    (the server's clock need not agree with ours), past the deadline by the grace, and
    never under the grace (a deadline from another clock than ``now``'s)."""
    return max(
        math.ceil((deadline - now + grace_seconds) * 1000), math.ceil(grace_seconds * 1000), 1
    )


def pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def record_from_hash(key_hash: str, fields: dict[bytes, bytes]) -> Record | None:
    """The record in a hash as HGETALL returns it; ``None`` for an empty (absent) one."""
    if not fields:
        return None
    status, fingerprint, owner, lock, expires, response = map(fields.get, FIELDS)
    too_large, size = fields.get(b"too_large") == b"1", fields.get(b"response_size", b"0")
    return record_from_fields(
        key_hash, status, fingerprint, owner, lock, expires, response, too_large, size
    )


FIELDS = (b"status", b"fingerprint", b"owner", b"lock_expires_at", b"expires_at", b"response")


def load_scripts() -> Flow[None]:
    """Load every script (``warm_up``), so the first claim does not pay for it."""
    for script in SCRIPTS.values():
        yield ("script_load", script.text)


class RedisOps:
    """The store's operations on records at ``prefix + key_hash``."""

    supports_deferral = True

    def __init__(
        self,
        prefix: str,
        grace_seconds: float,
        max_response_bytes: int | None,
        replicas: int = 0,
        replica_timeout_seconds: float = 0.5,
    ):
        self.prefix = prefix
        # WAIT's arguments after a claim or a completion; None: not waited for.
        self.wait = (
            (replicas, max(1, math.ceil(replica_timeout_seconds * 1000))) if replicas else None
        )
        # Completions and releases are published (the full key) on one channel per prefix,
        # from the script itself: waiters are woken without another round trip.
        self.channel = prefix + "changes"
        self.grace_seconds = grace_seconds
        self.max_response_bytes = max_response_bytes

    def _fenced(self, script: Script, key_hash: str, args: Sequence[Any]) -> Flow[bool]:
        return bool((yield from script.run(self.prefix + key_hash, args)))

    def claim(self, request: ClaimRequest) -> Flow[ClaimResult]:
        """Claim the key in one script; ``Held`` with the holding record (response
        included) in the same round trip otherwise."""
        key_hash, lock, now = request.key_hash, request.lock_expires_at, request.now
        ttl = ttl_ms(lock, now, self.grace_seconds)
        args = (request.fingerprint, request.owner, seconds(lock), seconds(now))
        key = self.prefix + key_hash
        reply = yield from CLAIM.run(key, (*args, seconds(request.stale_before), ttl), self.wait)
        if self.wait is not None:
            reply, acks = reply
            if not isinstance(reply, list) and acks < self.wait[0]:
                # Claimed, but a failover now would lose the claim and let a duplicate run:
                # released (fenced), and refused as the store being unavailable.
                yield from self._fenced(
                    RELEASE, key_hash, (request.owner, "in_progress", self.channel)
                )
                raise StoreUnavailable(
                    f"Redis claim of {key_hash!r} not replicated",
                    code="WAIT",
                    cause=NOT_REPLICATED,
                    reason=Lapse("claim", key_hash, acks, self.wait[0]).describe()
                    + f" within {self.wait[1]} ms; released",
                )
        if isinstance(reply, list):
            record = record_from_hash(key_hash, pairs(reply))
            if record is None:  # pragma: no cover - the script read this very record
                raise StoreUnavailable(f"Redis claim of {key_hash!r} answered an empty record")
            return Held(record)
        return TAKEN_OVER if reply == 1 else CLAIMED

    def _write(
        self,
        key: str,
        head: list[Any],
        ttl: int,
        response: StoredResponse,
        streamed: bool,
        handed_to: str | None = None,
    ) -> Flow[bool]:
        # COMPLETE's ARGV: the head (owner, guard, status, expires_at, response_size), then
        # too_large, the TTL, the channel, the owner handed to, and the blob when kept.
        blob = kept_blob(response, streamed, self.max_response_bytes, MAX_BLOB_BYTES)
        args = [*head, "1" if blob is None else "0", ttl, self.channel, handed_to or ""]
        args = args if blob is None else [*args, blob]
        if self.wait is None:
            return (yield from self._fenced(COMPLETE, key, args))
        reply, acks = yield from COMPLETE.run(self.prefix + key, args, self.wait)
        if reply and acks < self.wait[0]:
            # Landed on the primary: the response goes out; the lapse is logged and evented.
            yield Lapse("complete", key, acks, self.wait[0])
        return bool(reply)

    def complete(self, completion: Completion) -> Flow[bool]:
        c = completion
        guard, status = ("interim", Status.DEFERRED) if c.deferred else ("any", Status.COMPLETED)
        head = [c.owner, guard, status.value, seconds(c.expires_at), c.body_size]
        ttl = ttl_ms(c.expires_at, c.now, self.grace_seconds)
        return self._write(c.key_hash, head, ttl, c.response, c.streamed, c.deferred_to)

    def complete_final(
        self, token: DeferredToken, response: StoredResponse, now: float
    ) -> Flow[bool]:
        expires = float(token.expires_at)
        head = [token.owner, "final", Status.COMPLETED.value, seconds(expires), len(response.body)]
        ttl = ttl_ms(expires, now, self.grace_seconds)
        return self._write(token.key_hash, head, ttl, response, False)

    def release(self, key_hash: str, owner: str) -> Flow[bool]:
        return self._fenced(RELEASE, key_hash, (owner, "in_progress", self.channel))

    def release_unfinished(self, token: DeferredToken) -> Flow[bool]:
        return self._fenced(RELEASE, token.key_hash, (token.owner, "unfinished", self.channel))

    def renew(self, key_hash: str, owner: str, lock_expires_at: float) -> Flow[bool]:
        return self._fenced(RENEW, key_hash, (owner, seconds(lock_expires_at)))

    def get(self, key_hash: str) -> Flow[Record | None]:
        return record_from_hash(key_hash, (yield ("hgetall", self.prefix + key_hash)))

    def delete(self, key_hash: str) -> Flow[bool]:
        return bool((yield ("delete", self.prefix + key_hash)))

    def check(self) -> Flow[None]:
        """``PING``: the server answers."""
        yield ("ping",)

    create_table = check  # nothing to create in Redis
