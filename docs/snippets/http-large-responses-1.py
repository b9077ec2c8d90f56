from idempotency_middleware import AsyncDynamoDBStore

store = AsyncDynamoDBStore(
    "idempotency", s3_bucket="my-idempotency-overflow", s3_prefix="idempotency/"
)
