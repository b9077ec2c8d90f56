pip install "idempotency-middleware[mcp]"  # the official SDK; fastmcp users also have fastmcp
