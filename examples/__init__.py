"""Runnable examples of ``idempotent``, quoted in the README (run each with ``python -m``)."""
