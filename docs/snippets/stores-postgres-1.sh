pip install -e '.[postgres]'   # psycopg 3 (binary) and psycopg_pool
