"""Planted defects of the causal prefill kernel (``kernel/_prefill_kernel.py``), in the corpus's format.

Entries of ``mutants.MUTANTS``, each under a prefill definition, so that the property suite's prefill properties
(properties/test_prefill.py) must kill it; ``tests/test_prefill_kernel.py`` also checks that its own cases catch
each.
"""

from __future__ import annotations

from .mutants import Mutant, Patch

__all__ = ["PREFILL_MUTANTS"]

PREFILL_KERNEL = "_prefill_kernel.py"
_LIMIT = "limit = token + (kv_len - q_len) + 1"
_MASK = 'scores = tl.where(visible, scores, float("-inf"))'
PS1 = "gqa_paged_prefill_causal_h32_kv4_d128_ps1"
PS64 = "gqa_paged_prefill_causal_h32_kv4_d128_ps64"
RAGGED = "gqa_ragged_prefill_causal_h32_kv8_d128"
_OUTPUT = "output = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)"


def _prefill(old: str, new: str) -> tuple[Patch, ...]:
    return (Patch(PREFILL_KERNEL, old, new),)


PREFILL_MUTANTS: tuple[Mutant, ...] = (
    Mutant("prefill_top_left_alignment", "tail masking",
           "query i sees keys j <= i (top-left, plain is_causal) instead of j <= i + kv_len - q_len",
           _prefill(_LIMIT, "limit = token + 1"), definition=RAGGED),
    Mutant("prefill_limit_one_short", "tail masking",
           "each row misses its own diagonal key (j < i + kv_len - q_len); one-key rows come out empty",
           _prefill(_LIMIT, "limit = token + (kv_len - q_len)"), definition=PS1),
    Mutant("prefill_limit_one_long", "tail masking",
           "each row but the last sees the key after its diagonal",
           _prefill(_LIMIT, "limit = token + (kv_len - q_len) + 2"), definition=PS64),
    Mutant("prefill_masked_rows_nan", "empty sequences",
           "divides by the row's normaliser unguarded: a row that sees no key gives 0 / 0 = NaN",
           _prefill(_OUTPUT, "output = acc / l_i[:, None]"), definition=RAGGED),
    Mutant("prefill_finite_mask_sentinel", "extreme logits",
           "masks with -5e4 instead of -inf: masked keys take weight once the real logits are below it, and rows "
           "that see no key get a finite LSE (FlashInfer issues 4452, 4267)",
           _prefill(_MASK, "scores = tl.where(visible, scores, -5.0e4)"), definition=PS1),
    Mutant("prefill_tile_ends_at_first_row", "tail masking",
           "a tile's key loop stops at its first row's limit: the later rows of a tile lose keys",
           _prefill("last_token = tl.minimum((first_row + BLOCK_M - 1) // GROUP, q_len - 1)",
                    "last_token = first_row // GROUP"), definition=PS1),
    Mutant("prefill_last_page_full", "last page",
           "counts every page as full: reads the junk in the unused slots of last pages",
           _prefill("(kv_count - 1) * PAGE_SIZE + last_len", "kv_count * PAGE_SIZE"), definition=PS64),
)
