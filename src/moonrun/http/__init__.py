"""The HTTP service: the Run API and the user API on one route table, carried over to the
use cases in `moonrun.service`; never the store itself (docs/architecture.md, "Layers")."""
