"""vitplast_tune.search."""
