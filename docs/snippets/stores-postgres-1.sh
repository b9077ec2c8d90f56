pip install "idempotency-middleware[postgres]"   # psycopg 3 (binary) and psycopg_pool
