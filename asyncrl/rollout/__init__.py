"""Rollout: where prompts come from and how they become scored groups."""
