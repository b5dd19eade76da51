"""Serving a class: one engine's events fanned out to every page, its SSE followers and the
recording (hub, viewer, stream_state), who may do what and how often (policy, ratelimit), a
private block manager per page (sandbox)."""
