curl -X PUT localhost:8001/inventory/book -H 'Content-Type: application/json' -d '{"stock": 3}'
curl -i -X POST localhost:8001/orders -H 'Idempotency-Key: order-1' \
     -H 'Content-Type: application/json' -d '{"sku": "book", "quantity": 2}'
