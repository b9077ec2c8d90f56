from idempotency_middleware import AsyncDynamoDBStore

store = AsyncDynamoDBStore("idempotency", breaker_threshold=5, breaker_cooldown_seconds=5.0)
