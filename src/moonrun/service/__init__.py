"""The use cases: the scheduling service, the directory, and what they answer; the only code
above `moonrun.store` that touches a store (docs/architecture.md, "Layers")."""
