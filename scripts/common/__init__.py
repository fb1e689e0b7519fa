"""What the entry points of scripts/ share: `cuda_timing` (the GPU time of a call), `meta` (a run's output
folder default, device and versions), `progress` (the progress line of a long run).
"""
