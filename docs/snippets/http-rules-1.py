from idempotency_middleware import IdempotencyRule, scope_by_header

rules = [
    IdempotencyRule("/internal/{rest:path}", enabled=False),
    IdempotencyRule(
        "/payments", required=True, ttl_seconds=7 * 86400, scope=scope_by_header("X-Api-Key")
    ),
    IdempotencyRule("/orders/{order_id}/refunds", methods=["POST", "PUT"]),
]

# FastAPI / Starlette
app.add_middleware(IdempotencyMiddleware, store=store, rules=rules)
# Flask
app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, store=store, rules=rules)
