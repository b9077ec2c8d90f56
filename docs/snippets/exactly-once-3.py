import json

from idempotency_middleware import DynamoDBStore, completion_transaction, idempotent

store = DynamoDBStore("idempotency", region_name="eu-west-1")


@idempotent(store=store, key=lambda message: message["messageId"])
def reserve(message: dict) -> str:
    order = json.loads(message["body"])
    completion_transaction().update(
        "inventory",
        {"sku": order["sku"]},
        "SET stock = stock - :q",
        condition="stock >= :q",
        values={":q": order["quantity"]},
    )
    return "reserved"
