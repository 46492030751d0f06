"""Define the space language: typed parameter distributions and the search-space files made of them."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "files": ["SearchSpec", "load_space", "list_spaces", "spaces_dir", "searched_augmentations"],
        "distributions": [
            "Distribution",
            "Constant",
            "Choice",
            "Uniform",
            "LogUniform",
            "RandInt",
            "Subsets",
            "Methods",
            "OptunaSpace",
            "parse_param",
        ],
    },
)
