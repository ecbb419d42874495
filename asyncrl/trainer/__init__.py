"""The training side: batching, chunked log-probs, advantages, registered policy losses, optimiser, checkpoints.

``Trainer`` (trainer.py) turns groups of trajectories into optimizer steps; import it from its module.
"""
