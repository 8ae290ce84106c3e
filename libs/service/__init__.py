"""Shared service bootstrap: config, JSON logs, tracing, errors, health, metrics, lifecycle."""
