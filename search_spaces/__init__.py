"""The shipped search spaces (one YAML file each), installed as ``vitplast_tune.search_spaces``: see ``search.spaces``."""
