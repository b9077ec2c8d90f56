AsyncDynamoDBStore("idempotency", s3_bucket="my-idempotency-overflow", s3_prefix="idempotency/")
