"""`kvscope serve --attach URL`: the explainer drawing a running vLLM server instead of
kvscope's own engine. vLLM's KV events (ZeroMQ) become `kv` events, its /metrics become
`memory` and `engine` events, and learners' prompts go through its OpenAI API and come
back as `request.*` events, so the same pages and widgets draw a real deployment."""
