curl -i -X POST localhost:8001/orders -H 'Idempotency-Key: order-1' \
     -H 'Content-Type: application/json' -d '{"item": "book", "quantity": 1}'
