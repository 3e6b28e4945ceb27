"""Case generation: small frozen descriptors (``cases.DecodeCase``), the Hypothesis strategies that draw them,
the one deterministic builder that makes tensors from them on any device, metamorphic transforms, FlashInfer-Bench
workloads read as cases, and the stages an example's time is split into.
Causal prefill has modules of its own (``prefill_cases``, ``prefill_strategies``, ``prefill_transforms``), built
on decode's page layouts, junk, value regimes and scales.
"""
