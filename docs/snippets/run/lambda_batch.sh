make install
.venv/bin/python -m examples.lambda_batch
