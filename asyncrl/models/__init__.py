"""Tiny causal LMs and tokenizers built by the project, and loading any model directory the Hugging Face way.

Import from the submodules (``asyncrl.models.tiny``, ``.tokenizer``, ``.loading``); this package itself
imports nothing heavy, so the CLI can name it without pulling in torch.
"""
