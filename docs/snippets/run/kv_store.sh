make install
.venv/bin/pytest -q tests/contract/test_store_contract.py -k kv
