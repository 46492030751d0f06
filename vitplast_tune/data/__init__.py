"""vitplast_tune.data."""
