"""PIN hashing for one-time actions: salted scrypt, checked in constant time.

The salt is derived from the action's id instead of being stored, so a consume can hash the
PIN before touching the store and send the hash as its write's condition: one write, no read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

# scrypt's cost: 16 MiB and tens of milliseconds per hash. A PIN has little entropy, so the
# hash only slows an attacker holding a copy of the table; the attempt limit is what guards
# a live action.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_PIN_SALT_CONTEXT = b"idempotency-middleware/one-time-action-pin\x00"


def pin_salt(action_id: str) -> bytes:
    """The action's salt, derived from its id: a consume can then hash the PIN before
    touching the store and send the hash as the write's condition (one write, no read).
    Unique per action, as a salt must be; it need not be secret."""
    return hashlib.sha256(_PIN_SALT_CONTEXT + action_id.encode()).digest()[:16]


def hash_pin(
    action_id: str, pin: str, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P
) -> str:
    """``scrypt$n$r$p$<base64 key>``: the parameters travel with the hash, so a later
    version with other costs can still check a PIN set under these."""
    key = hashlib.scrypt(
        pin.encode(), salt=pin_salt(action_id), n=n, r=r, p=p, maxmem=256 * r * n, dklen=32
    )
    return f"scrypt${n}${r}${p}${base64.b64encode(key).decode()}"


def same_costs(first: str, second: str) -> bool:
    """Whether two PIN hashes were made with the same function and costs."""
    return first.rpartition("$")[0] == second.rpartition("$")[0]


def pin_matches(stored: str, action_id: str, pin: str) -> bool:
    """Whether ``pin`` is the PIN ``stored`` was made from, under ``stored``'s own costs;
    compared in constant time."""
    try:
        kdf, n, r, p, _ = stored.split("$")
        parameters = (int(n), int(r), int(p))
    except ValueError:
        return False
    if kdf != "scrypt":
        return False
    return hmac.compare_digest(stored.encode(), hash_pin(action_id, pin, *parameters).encode())
