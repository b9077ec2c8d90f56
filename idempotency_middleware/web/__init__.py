"""The HTTP doors: ASGI (Starlette, FastAPI), WSGI (Flask) and Django, each a translation of
one request into the engine's attempt, and the helpers that read a request and buffer, count
and send a response."""
