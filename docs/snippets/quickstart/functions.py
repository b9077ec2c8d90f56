from idempotency_middleware import SQLiteStore, idempotent

store = SQLiteStore("idempotency.sqlite3")
store.check()  # a store that cannot work fails here, not at the first call


@idempotent(store=store, key=lambda message: message["id"])
def handle(message: dict) -> dict:
    # Charge the card, write the row, send the email: once per message id.
    print("charging", message["id"])
    return {"charged": message["id"]}


handle({"id": "msg-1", "amount": 5})  # runs: prints "charging msg-1"
handle({"id": "msg-1", "amount": 5})  # a redelivery: the stored result, nothing printed
