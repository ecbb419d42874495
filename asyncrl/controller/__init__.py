"""The training loop and its modes."""
