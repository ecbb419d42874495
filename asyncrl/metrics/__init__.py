"""Metrics: per-step records to JSONL and a one-line console progress report."""
