"""Run: the agent on each host. It speaks PROTOCOL.md only and never imports the platform."""
