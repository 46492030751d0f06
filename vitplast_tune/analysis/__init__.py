"""vitplast_tune.analysis."""
