"""The pure scheduling domain: states, transitions, retry, fencing, reconcile plans, views.

Nothing in this package does I/O, reads a clock or draws random numbers; callers pass `now`,
tokens and random draws in.
"""
