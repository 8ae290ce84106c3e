"""Measured profiles and route calibrations (see schema.py)."""
