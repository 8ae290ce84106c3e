"""Structured outputs: grammars (llguidance Lark, JSON schemas embedded) and per-request
decoding state at the final stage (grammar matcher, generated-token history)."""
