"""Analyze a search's trials: rank statistics, the paper's protocol, the criteria lab, importance and depth."""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(
    __name__,
    submod_attrs={
        "analyze": ["SearchAnalysis", "analyze_search"],
        "correlation": ["correlations", "compare_with_baseline", "spearman", "kendall"],
        "bootstrap": ["bca", "Bca"],
        "protocol": ["paper_results", "relative_gain", "best_lr_table", "cross_dataset_report"],
        "subsets": ["criteria_lab"],
        "subsets_report": ["describe_lab"],
        "bracket": ["bracket_table"],
        "resampling": ["runs_of", "resample"],
        "multiple": ["holm"],
        "verdicts": ["TestResult", "sentence"],
        "importance": ["parameter_importance"],
        "depth": ["analyze_depth"],
    },
)
