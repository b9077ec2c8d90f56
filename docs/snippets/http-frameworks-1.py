# --8<-- [start:setup]
import django
from django.conf import settings
from starlette.routing import Route

from idempotency_middleware import (
    AsyncDynamoDBStore,
    DynamoDBStore,
    IdempotencyMiddleware,
    IdempotencyWSGIMiddleware,
    MemoryStore,
)

settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"], SECRET_KEY="docs")
django.setup()
urlpatterns: list[object] = []
store = MemoryStore()
routes: list[Route] = []
# --8<-- [end:setup]
# --8<-- [start:starlette]
from starlette.applications import Starlette
from starlette.middleware import Middleware

app = Starlette(routes=routes, middleware=[Middleware(IdempotencyMiddleware, store=store)])
# --8<-- [end:starlette]
# --8<-- [start:django-asgi]
# asgi.py: an all-async stack; or use the Django middleware below
from django.core.asgi import get_asgi_application

application = IdempotencyMiddleware(
    get_asgi_application(), store=AsyncDynamoDBStore("idempotency", region_name="eu-west-1")
)
# --8<-- [end:django-asgi]
# --8<-- [start:django-wsgi]
# wsgi.py; or use the Django middleware below
from django.core.wsgi import get_wsgi_application

application = IdempotencyWSGIMiddleware(
    get_wsgi_application(), store=DynamoDBStore("idempotency", region_name="eu-west-1")
)
# --8<-- [end:django-wsgi]
