"""The ways into the server: the `/ws` WebSocket and its commands, REST with Server-Sent
Events, the OpenAI-compatible API, the replay socket, and the validation every client
message passes before anything acts on it."""
