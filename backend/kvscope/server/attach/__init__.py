"""`kvscope serve --attach URL`: the same pages drawing a running vLLM server."""
