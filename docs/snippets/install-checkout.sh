git clone <the repository> idempotency-middleware && cd idempotency-middleware
pip install -e '.[fastapi]'
