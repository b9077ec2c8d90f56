curl -i -X POST localhost:8001/actions -H 'Idempotency-Key: link-1' \
     -H 'Content-Type: application/json' -d '{"expires_in": 900, "data": {"user_id": 42}}'
