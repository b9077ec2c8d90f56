pip install -e '.[fastapi]' uvicorn   # from the checkout
uvicorn app:app --lifespan on         # on http://127.0.0.1:8000; a failed check stops it
