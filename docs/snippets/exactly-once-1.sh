pip install -e '.[dynamodb,fastapi]' uvicorn   # from a checkout
