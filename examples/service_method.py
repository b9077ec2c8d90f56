"""An async service whose ``charge`` runs once per request id, however often it is retried.

The decorator goes on the method; ``self`` is not part of the payload, so a retry reaching
another instance (another handler, another pool worker) is still a duplicate. A retry with
the same id gets the first call's ``Receipt`` back, rebuilt from the return annotation; the
same id with another amount raises ``KeyReusedError``.

    python -m examples.service_method
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from idempotency_middleware import MemoryStore, idempotent

# In-process, for the example; AsyncDynamoDBStore(table) or SQLiteStore(path) share the
# keys between processes.
store = MemoryStore()


@dataclass(frozen=True)
class Receipt:
    request_id: str
    amount: int
    charge_id: str


class PaymentGateway:
    """Stands in for the payment provider's client; counts the charges it makes."""

    def __init__(self) -> None:
        self.charges: list[int] = []

    async def charge(self, amount: int) -> str:
        self.charges.append(amount)
        return f"ch_{len(self.charges)}"


class PaymentService:
    def __init__(self, gateway: PaymentGateway) -> None:
        self.gateway = gateway

    @idempotent(store=store, key="request_id")
    async def charge(self, request_id: str, amount: int) -> Receipt:
        charge_id = await self.gateway.charge(amount)
        return Receipt(request_id, amount, charge_id)


async def main() -> None:
    gateway = PaymentGateway()
    first = await PaymentService(gateway).charge("req-1", 1999)
    retry = await PaymentService(gateway).charge("req-1", 1999)  # another instance, same id
    print(first, retry == first, gateway.charges)  # ... True [1999]: charged once


if __name__ == "__main__":
    asyncio.run(main())
