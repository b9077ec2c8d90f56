curl -X POST localhost:8000/orders -H 'Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"' \
     -H 'Content-Type: application/json' -d '{"item": "book", "quantity": 1}'
