gunicorn --workers 4 --threads 8 myapp:app
