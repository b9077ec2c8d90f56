make demo   # creates .venv, installs, runs FastAPI and Flask apps on moto's DynamoDB server on 127.0.0.1 and shows the behaviour
make test   # creates .venv, installs, runs lint (ruff), type checks (mypy --strict), builds the docs and runs the whole test suite
