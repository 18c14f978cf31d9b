"""Run: the agent on each host. It speaks docs/protocol.md only and never imports the platform."""
