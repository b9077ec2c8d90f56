pip wheel . -w dist --no-deps   # or: python -m build (the wheel and the sdist, in dist/)
pip install --find-links dist 'idempotency-middleware[fastapi]'
