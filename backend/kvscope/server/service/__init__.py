"""The engine behind the server: one LLMEngine stepping in its own thread (async_engine),
paced so a person can watch it (pacing), and the operations every entry point shares
(engine_service), with the Prometheus figures it keeps (metrics)."""
