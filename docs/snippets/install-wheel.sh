pip wheel . -w dist --no-deps   # or: python -m build
pip install --find-links dist 'idempotency-middleware[fastapi]'
