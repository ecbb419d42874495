"""Configuration: pure data, import-light (no torch). One module per part; ``run.RunConfig`` composes them."""
