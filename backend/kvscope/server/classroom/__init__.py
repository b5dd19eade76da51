"""Serving a class: one engine's events fanned out to every page (hub, viewer, followers,
stream_state), who may do what and how often (policy, ratelimit), a private block manager
per page (sandbox), and the recording of a session (recording_tap)."""
