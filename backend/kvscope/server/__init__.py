"""The live server (`kvscope serve`): docs/server.md gives its folders and their reading order."""
