flask --app flask_quickstart create-table   # once (or: idempotency-middleware create-table)
waitress-serve flask_quickstart:app         # or gunicorn, or any WSGI server
