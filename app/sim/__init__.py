"""A deterministic, seeded simulation of the whole dispatcher (see app/sim/README.md for its
modules); the unit tier's sweep checks it against invariants after every step (the harness:
tests/sim)."""
