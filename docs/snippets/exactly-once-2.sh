uvicorn exactly_once_orders:app
curl -X PUT localhost:8000/inventory/book -H 'Content-Type: application/json' -d '{"stock": 3}'
curl -X POST localhost:8000/orders -H 'Idempotency-Key: order-1' \
     -H 'Content-Type: application/json' -d '{"sku": "book", "quantity": 2}'
