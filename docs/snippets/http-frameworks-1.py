"""The Starlette, Django asgi.py and Django wsgi.py tabs; each one a whole file as pasted.
Run whole, the settings module the Django ones name is a minimal one of the tests."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.docs_django_settings")
# --8<-- [start:starlette]
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_middleware import IdempotencyMiddleware, SQLiteStore


async def create_order(request: Request) -> JSONResponse:
    return JSONResponse(await request.json(), status_code=201)


app = Starlette(
    routes=[Route("/orders", create_order, methods=["POST"])],
    middleware=[Middleware(IdempotencyMiddleware, store=SQLiteStore("idempotency.sqlite3"))],
)
# --8<-- [end:starlette]
# --8<-- [start:django-asgi]
# asgi.py: an all-async stack; or use the Django middleware below
import os

from django.core.asgi import get_asgi_application

from idempotency_middleware import AsyncDynamoDBStore, IdempotencyMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = IdempotencyMiddleware(
    get_asgi_application(), store=AsyncDynamoDBStore("idempotency", region_name="eu-west-1")
)
# --8<-- [end:django-asgi]
# --8<-- [start:django-wsgi]
# wsgi.py; or use the Django middleware below
import os

from django.core.wsgi import get_wsgi_application

from idempotency_middleware import DynamoDBStore, IdempotencyWSGIMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = IdempotencyWSGIMiddleware(
    get_wsgi_application(), store=DynamoDBStore("idempotency", region_name="eu-west-1")
)
# --8<-- [end:django-wsgi]
