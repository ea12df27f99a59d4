"""The simulator's bug-hunting harness (tests/sim/README.md): random worlds per seed, the
adversary and the checker a `app.sim.simulation.Simulation` is given in the unit tier's
sweep; `python -m tests.sim` hunts seeds."""
