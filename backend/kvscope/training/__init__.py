"""How kvscope-mini, the embedded default model, is made.

corpus.py (with lexicon.py and plots.py) generates the stories from seeds, tokenizer.py trains
the byte-level BPE, train.py trains a transformers Qwen3ForCausalLM and writes the checkpoint,
evaluate.py measures held-out loss and question answering, model_card.py writes README.md.
Nothing here is imported by the engine or the server.
"""
