"""The engine behind the server, stepping in its own thread, and the operations every way in shares."""
