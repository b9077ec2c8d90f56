# Starlette
from starlette.applications import Starlette
from starlette.middleware import Middleware

app = Starlette(routes=routes, middleware=[Middleware(IdempotencyMiddleware, store=store)])

# Litestar: wrap the ASGI app
from litestar import Litestar

app = IdempotencyMiddleware(Litestar(route_handlers=[...]), store=store)

# Django (asgi.py), an all-async stack; or use the Django middleware below
from django.core.asgi import get_asgi_application

application = IdempotencyMiddleware(
    get_asgi_application(), store=AsyncDynamoDBStore("idempotency", region_name="eu-west-1")
)

# Django (wsgi.py); or use the Django middleware below
from django.core.wsgi import get_wsgi_application

application = IdempotencyWSGIMiddleware(
    get_wsgi_application(), store=DynamoDBStore("idempotency", region_name="eu-west-1")
)
