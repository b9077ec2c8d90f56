curl -i -X POST localhost:8000/orders -H 'Idempotency-Key: order-1' \
     -H 'Content-Type: application/json' -d '{"item": "book"}'
