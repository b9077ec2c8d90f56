uvicorn --lifespan on myapp:app
