"""The wiring, the room above `http/` and `web/`: it builds the platform from configuration
(settings.py), bundles it (platform.py) and serves it (app.py, error_handlers.py). The only room,
with `cli.py`, that reads flags or chooses implementations; nothing imports it but `cli.py`."""
