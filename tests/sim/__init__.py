"""A deterministic whole-system simulation of moonrun, and a checker over what it recorded.

The real `SchedulingService` and `Directory` over a real store (MemoryStore or FileStore), N
simulated Runs that follow the wire protocol's rules as `moonrun.run.agent` does, users, a
network and clocks: all driven by one seeded `random.Random`, on simulated time (never a
sleep). `world.simulate(seed, store)` runs one seed; `checker.check(history)` says which
promised property the recorded history breaks. docs/simulation.md describes it.
"""
