"""Metrics and traces out of the box: give ``OpenTelemetry()`` or ``Prometheus()`` as
``on_event=`` to any door or store (the Observability page of the documentation).

The libraries they stand on are imported when a hook is built: ``OpenTelemetry`` needs the
``otel`` extra, ``Prometheus`` the ``prometheus`` one.
"""

from __future__ import annotations

from .opentelemetry import OpenTelemetry
from .prometheus import Prometheus

__all__ = ["OpenTelemetry", "Prometheus"]
