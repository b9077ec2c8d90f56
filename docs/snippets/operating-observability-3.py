from opentelemetry import metrics

meter = metrics.get_meter("idempotency_middleware")
events = meter.create_counter("idempotency.events")


def on_event(event):
    events.add(1, {"kind": event.kind, "route": f"{event.method} {event.route}"})
