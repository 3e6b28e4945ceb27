"""The suite's pytest plugin (``plugin.py`` is its one entry) and the machinery behind it.

``target`` (what is under test, and where), ``gpus`` (xdist workers on GPUs), ``shards``
(properties split over workers; one report per failing property), ``knobs`` (kernel
knobs drawn per example), ``containment`` (CUDA faults), ``mps`` (crashes under MPS,
replayed alone), ``casefiles`` (failing examples saved for replay), ``profiles``
(Hypothesis profiles and databases), ``run_report``.
Nothing here imports torch at package import: ``plugin`` pins the GPU first.
"""
