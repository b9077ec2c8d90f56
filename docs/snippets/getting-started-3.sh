pip install "moto[server]"
moto_server -p 8000 &   # on 127.0.0.1
AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:8000 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
    uvicorn fastapi_quickstart:app
