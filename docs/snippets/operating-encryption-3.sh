pip install "idempotency-middleware[dynamodb,encryption]"
