from idempotency_middleware import AsyncDynamoDBStore, idempotent

store = AsyncDynamoDBStore("idempotency", region_name="eu-west-1")


@idempotent(store=store, key=lambda message: message["messageId"])
async def handle(message: dict) -> dict:
    # charge the card, write the row, send the email: once per messageId
    return {"charged": message["messageId"]}
