pip install "idempotency-middleware[boto3,django]"
