# Fornax MAX custom ops: float32 activations @ GGUF block-format weights.
