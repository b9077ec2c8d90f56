make install
.venv/bin/python examples/mcp_server.py
