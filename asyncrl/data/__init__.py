"""User datasets (JSONL / Parquet) and the reasoning-gym adapter, both producing ``TaskSample``s."""
