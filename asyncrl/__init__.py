"""asyncrl: asynchronous RL post-training for LLMs with bounded staleness."""

__version__ = "0.1.0"
