# settings.py
from idempotency_middleware import DynamoDBStore, IdempotencyRule, scope_by_header

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "idempotency_middleware.django.IdempotencyDjangoMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # ...
]

IDEMPOTENCY = {
    "store": DynamoDBStore("idempotency", region_name="eu-west-1"),
    "scope": scope_by_header("Authorization"),
    "rules": [IdempotencyRule("/orders/{order_id:int}/refunds", required=True)],
}
