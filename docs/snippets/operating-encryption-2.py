import os

from idempotency_middleware import Encryption, MemoryStore, idempotent

# The keys, as the instances read them (the Encryption page: an env variable).
os.environ["IDEMPOTENCY_KEY_2026_10"] = os.urandom(32).hex()
os.environ["IDEMPOTENCY_KEY_2026_11"] = os.urandom(32).hex()
old_key = bytes.fromhex(os.environ["IDEMPOTENCY_KEY_2026_10"])
store = MemoryStore()
runs = []


def deploy(encryption: Encryption):
    @idempotent(store=store, key="order_id", name="charge", encryption=encryption)
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    return charge


charge = deploy(Encryption(keys={"2026-10": old_key}, current="2026-10"))
charge("o-1")  # sealed under 2026-10

# --8<-- [start:rotate]
# Step 3: every instance lists both keys and encrypts new records with the new one.
import os

from idempotency_middleware import Encryption

encryption = Encryption(
    keys={
        "2026-10": bytes.fromhex(os.environ["IDEMPOTENCY_KEY_2026_10"]),
        "2026-11": bytes.fromhex(os.environ["IDEMPOTENCY_KEY_2026_11"]),
    },
    current="2026-11",
)
# --8<-- [end:rotate]
charge = deploy(encryption)
assert charge("o-1") == "charged o-1"  # sealed under 2026-10: replayed, not run again
charge("o-2")  # sealed under 2026-11
assert runs == ["o-1", "o-2"]

# --8<-- [start:retire]
# Step 4, one ttl_seconds later: no record encrypted under 2026-10 is left to replay.
import os

from idempotency_middleware import Encryption

encryption = Encryption(
    keys={"2026-11": bytes.fromhex(os.environ["IDEMPOTENCY_KEY_2026_11"])}, current="2026-11"
)
# --8<-- [end:retire]
charge = deploy(encryption)
assert charge("o-2") == "charged o-2"
assert runs == ["o-1", "o-2"]
