"""Weight formats: GGUF block layouts, their codecs, per-tensor policies and compact tensors."""
