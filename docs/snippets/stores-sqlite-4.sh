uvicorn --workers 4 myapp:app
