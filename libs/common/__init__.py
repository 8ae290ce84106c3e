"""Vocabulary shared by every layer: the enums that name backends and element types."""
