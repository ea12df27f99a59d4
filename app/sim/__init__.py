"""A deterministic, seeded simulation of the whole dispatcher, checked against invariants
after every step (see app/sim/simulation.py and app/sim/FINDINGS.md)."""
