pip install 'idempotency-middleware[redis]'    # redis-py >= 5
