"""moonrun: a durable job scheduler for fleets of hosts (the platform and its Run agent)."""

__version__ = "0.1.0"
