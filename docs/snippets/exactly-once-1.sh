pip install "idempotency-middleware[dynamodb,fastapi]" uvicorn
