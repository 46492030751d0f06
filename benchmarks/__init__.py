"""The benchmarks: each prints ratios measured in one run on one machine (docs/benchmarks.md has the results).

Run each from the repository root as ``python -m benchmarks.NAME`` (``--help`` lists its flags):

- ``training``: steps/s and peak memory of each single-component and the head-only trial vs full finetuning, beside the FLOP bound.
- ``trial``: the fraction of a real Ray Tune trial's wall time spent in training and evaluation steps, and where the rest goes.
- ``search``: training steps grid, random search and TPE (+ ASHA) need to reach the grid's best accuracy, as a fraction of the grid's.
- ``data``: host bytes of the in-memory datasets at 224 px, and input-pipeline images/s per core vs the model's training images/s.
- ``memory``: peak driver RSS and process-tree PSS of a one-trial search.
- ``plasticity``: plasticity time (both variants) over plain forward passes of the same images.
- ``augment``: best validation accuracy of each training augmentation recipe on a dataset, over learning rates and subsets.
- ``quickstart``: where the README's main command spends its time (phases, CPU by process, trials) and the accuracy it reaches.
- ``budget``: full finetuning's accuracy at the end of each step budget (the criteria lab's long budget).
- ``coverage``: the coverage of the analysis's BCa intervals by sample size (the minimum for a verdict).
- ``gpu_check``: ViT-B/16 at 224 px on one GPU: fp32 / CUDA options / compile images/s, subsets vs FLOP bound, pipeline share, 4 trials at 0.25 GPU.
- ``gpu_search``: whole searches on one GPU at 0.25, 0.5 and 1 GPU per trial: images/s vs one trial alone, NVML busy share, gaps between trials, fraction of peak FLOPs.

``benchmarks.common`` holds the set-up they share.
"""
