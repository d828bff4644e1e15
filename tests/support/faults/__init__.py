"""Fault injection helpers for crash tests (a loopback TCP proxy that breaks on purpose)."""

from tests.support.faults.proxy import FaultProxy

__all__ = ["FaultProxy"]
