"""`kvscope serve --attach URL`: the same pages drawing a running vLLM server, its KV events,
/metrics and OpenAI API turned into our `kv`, `engine` and `request.*` events."""
