"""Bench, synthetic data, demo, shuffle quality: not imported by the core."""
