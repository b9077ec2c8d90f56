make install
.venv/bin/python -m examples.step_functions_status_change
