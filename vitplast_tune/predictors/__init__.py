"""vitplast_tune.predictors."""
