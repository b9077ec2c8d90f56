make install
.venv/bin/python -m examples.service_method
