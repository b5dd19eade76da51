"""Serving a class: fan-out, viewers, policy and limits, sandboxes, sweeps (docs/server.md)."""
