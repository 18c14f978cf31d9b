"""The platform: use cases over the store (and, later, the HTTP service and console)."""
