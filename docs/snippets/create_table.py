import asyncio

from idempotency_middleware import AsyncDynamoDBStore


async def main() -> None:
    async with AsyncDynamoDBStore("idempotency", region_name="eu-west-1") as store:
        await store.create_table()


asyncio.run(main())
