"""A deterministic, seeded simulation of the whole dispatcher, checked against invariants
after every step (see tests/sim/simulation.py and tests/sim/FINDINGS.md)."""
