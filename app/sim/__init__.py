"""A deterministic, seeded simulation of the whole dispatcher, checked against invariants
after every step (see app/sim/README.md for its modules, and app/sim/FINDINGS.md)."""
