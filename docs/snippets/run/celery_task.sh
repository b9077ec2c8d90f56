make install
.venv/bin/python -m examples.celery_task
