"""Runnable examples, shown on the documentation site (each page gives the command that runs it)."""
