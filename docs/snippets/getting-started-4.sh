idempotency-middleware create-table --table idempotency --region eu-west-1
