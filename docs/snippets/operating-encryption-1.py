# --8<-- [start:generate]
import os

key = os.urandom(32)  # or AESGCM.generate_key(bit_length=256)
print(key.hex())  # store it with your other secrets (a secrets manager, an env variable)
# --8<-- [end:generate]
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

assert len(AESGCM.generate_key(bit_length=256)) == 32
os.environ["IDEMPOTENCY_KEY_2026_11"] = key.hex()

# --8<-- [start:configure]
import os

from fastapi import FastAPI

from idempotency_middleware import Encryption, IdempotencyMiddleware, MemoryStore, idempotent

encryption = Encryption(
    keys={"2026-11": bytes.fromhex(os.environ["IDEMPOTENCY_KEY_2026_11"])},
    current="2026-11",
)
store = MemoryStore()  # any store: DynamoDB (and its S3 overflow), Redis, PostgreSQL, SQLite

app = FastAPI()
app.add_middleware(IdempotencyMiddleware, store=store, encryption=encryption)


@idempotent(store=store, key="order_id", encryption=encryption)
def charge(order_id: str, card: str) -> dict[str, str]:
    return {"order": order_id, "card": card}


# --8<-- [end:configure]


assert charge("o-1", "4242") == charge("o-1", "4242")
(record,) = store._records.values()
assert b"4242" not in record.response.body  # what the store keeps is the ciphertext
