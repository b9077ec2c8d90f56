make install
.venv/bin/python -m moto.server -p 8000 &   # a local DynamoDB: moto's server on 127.0.0.1:8000
until curl -s localhost:8000 > /dev/null; do sleep 0.2; done   # until it answers
export AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:8000 AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local
.venv/bin/uvicorn examples.one_time_actions:app --port 8001
