# settings.py: the middleware, and the store it keeps keys in.
from idempotency_middleware import SQLiteStore

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "idempotency_middleware.django.IdempotencyDjangoMiddleware",
    "django.middleware.common.CommonMiddleware",
    # ... the rest of your middleware, and your views: unchanged
]

IDEMPOTENCY = {"store": SQLiteStore("idempotency.sqlite3"), "check_store": True}
