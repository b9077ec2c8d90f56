curl -i -X POST localhost:8001/payments -H 'Idempotency-Key: payment-1' -H 'X-Api-Key: caller-1' \
     -H 'Content-Type: application/json' -d '{"amount": 5}'
