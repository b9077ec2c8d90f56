"""Stores: where claims and completed responses live."""
