from prometheus_client import Counter, Histogram

EVENTS = Counter("idempotency_events_total", "Idempotency middleware events", ["kind", "route"])
STORE_LATENCY = Histogram("idempotency_store_seconds", "Store call latency")


def on_event(event):
    EVENTS.labels(event.kind, f"{event.method} {event.route}").inc()
    if event.store_latency_ms is not None:
        STORE_LATENCY.observe(event.store_latency_ms / 1000)


app.add_middleware(IdempotencyMiddleware, store=store, on_event=on_event)
