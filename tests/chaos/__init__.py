"""Randomized, seeded chaos runs: real worker processes, injected faults, invariant checks."""
