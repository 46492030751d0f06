"""vitplast_tune."""
