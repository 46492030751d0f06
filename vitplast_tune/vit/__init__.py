"""vitplast_tune.vit."""
