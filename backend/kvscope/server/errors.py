"""The one error a client's message can cause: a code and a message that go back to the client."""
from __future__ import annotations


class CommandError(Exception):
    def __init__(self, code: str, message: str, request_id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id
