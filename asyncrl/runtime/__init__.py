"""Where the parts live: ``inline`` (one process) or Ray actors (``local``/``cluster``); the only package importing ray."""
