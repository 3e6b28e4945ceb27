"""The property files' shared checks (properties/checks.py) do what the properties rely on."""

import torch

from gqa_decode_fuzz.properties.checks import poisoned_allocations


def test_poisoned_allocations_fill_fresh_memory_and_restore_the_settings():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    with poisoned_allocations():
        assert bool(torch.empty(1000).isnan().all())
        assert bool((torch.empty(1000, dtype=torch.int32) == torch.iinfo(torch.int32).max).all())
    after = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    assert after == before
