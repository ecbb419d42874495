"""OpenAI-compatible endpoint over the LLM proxy, with token-in/token-out trajectories per conversation."""
