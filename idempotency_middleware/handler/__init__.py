"""What a running handler can reach: the attempt it runs in, a DynamoDB transaction committed
with its completion, a deferral of its completion."""
