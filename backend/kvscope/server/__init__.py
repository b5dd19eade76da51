"""The live server (`kvscope serve`). Read docs/server.md first; the folders, bottom up:

    config.py, security.py, redact.py, cli_args.py   settings, and what a browser may do
    classroom/   serving a class: the fan-out (hub) to viewers and followers, the policy and
                 rate limits, the sandbox, the recording tap
    service/     the engine behind the server: AsyncEngine in its own thread, pacing, the
                 operations every entry point shares (EngineService), the metrics
    api/         the ways in: WebSocket commands, REST/SSE, OpenAI API, replay socket, and the
                 validation every client message passes
    pages/       the explainer's HTML pages, rendered from content/
    attach/      the same pages drawing a running vLLM server instead of our engine
    app.py, main.py   the FastAPI app and `kvscope serve` that put these together"""
