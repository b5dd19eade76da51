"""The live server: FastAPI app, WebSocket fan-out of engine events, REST, SSE and an
OpenAI-compatible API, instructor controls, recording and replay."""
