pip install "idempotency-middleware[boto3,flask]" waitress
