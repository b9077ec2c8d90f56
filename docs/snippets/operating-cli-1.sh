idempotency-middleware create-table --table idempotency --region eu-west-1
idempotency-middleware show '"8e03978e-..."' --route /orders --table idempotency
idempotency-middleware delete '"8e03978e-..."' --route /orders --method POST --table idempotency
idempotency-middleware show '"8e03978e-..."' --route /orders --redis redis://cache:6379/0
idempotency-middleware create-table --postgres postgresql://app@db/app --table idempotency
idempotency-middleware show m-1 --consumer orders.ship --table idempotency
idempotency-middleware delete --function orders.ship --keys-from dead-letter-keys.txt --table idempotency
idempotency-middleware demo
