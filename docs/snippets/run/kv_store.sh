make install
.venv/bin/pytest -q tests/test_store_contract.py -k kv
