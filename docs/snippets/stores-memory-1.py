from idempotency_middleware import MemoryStore, idempotent

store = MemoryStore()
calls = []


@idempotent(store=store, key=lambda order_id: order_id)
def charge(order_id: str) -> str:
    calls.append(order_id)
    return f"charged {order_id}"


assert charge("order-1") == "charged order-1"
assert charge("order-1") == "charged order-1"  # replayed: the body ran once
assert calls == ["order-1"]
