"""vitplast_tune.recommend."""
