uvicorn long_running_work:app
curl -i -X POST localhost:8000/reports -H 'Idempotency-Key: report-1' \
     -H 'Content-Type: application/json' -d '{"month": "2026-11"}'
