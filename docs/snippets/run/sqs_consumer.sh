make install
.venv/bin/python -m examples.sqs_consumer
