pip install -e '.[fastapi]' uvicorn   # from the checkout
uvicorn app:app                       # on http://127.0.0.1:8000
