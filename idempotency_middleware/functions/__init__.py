"""The function door: ``idempotent`` for any function, sync or async, and the attempt
machinery every callable door (consumers and their brokers too) builds on."""
