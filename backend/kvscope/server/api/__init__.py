"""The ways in: WebSocket and its commands, REST with SSE, the OpenAI API, replay, validation."""
