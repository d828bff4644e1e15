"""Fault injection helpers for crash tests (a loopback TCP proxy that breaks on purpose)."""

from tests.faults.proxy import FaultProxy

__all__ = ["FaultProxy"]
