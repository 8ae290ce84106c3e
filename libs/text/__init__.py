"""Text handling shared by the orchestrator, the Engine and `fornax chat`.

The tokenizer and the chat template are pinned by sha256; detokenization is incremental and
never emits a delta carrying broken UTF-8.
"""
