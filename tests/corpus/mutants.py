"""The corpus entries: each a small deliberate defect of ``kernel/``, written as source patches.

A patch replaces one exact snippet of ``kernel/_kernel.py`` or ``kernel/_launch.py``;
``materialise`` asserts that the snippet occurs exactly once, so a kernel edit that
breaks a mutant fails loudly with the mutant's name instead of silently testing
nothing. Only the seed is a whole file (``seed_original.py``, kept verbatim).

``gpu_only`` marks a mutant whose defect the CPU suite cannot reach (page ids of
2**22 and more need a pool of about 8.6 GB; the seed refuses to run without CUDA),
so its kill is recorded on an H200 (docs/mutants.md).

``definition`` names the definition a mutant runs under (``--definition``): the seed's
by default; the defects of last pages and of padded heads show only where pages hold
several tokens or the head count is not a power of two. The prefill kernel's mutants
(``prefill_mutants.py``) run under prefill definitions, so the prefill properties judge them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLASSES", "DECODE_MUTANTS", "MUTANTS", "Mutant", "Patch", "by_name"]

KERNEL, LAUNCH = "_kernel.py", "_launch.py"


@dataclass(frozen=True)
class Patch:
    """Replace the one occurrence of ``old`` in ``kernel/<file>`` with ``new``."""

    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """One corpus entry.

    name: identifier (pytest id, report row, temporary package name).
    defect_class: which kind of defect it stands for (one of ``CLASSES``).
    rationale: one line: what is wrong and which inputs expose it.
    patches: source patches of kernel/ (empty for a whole-file entry).
    file: a complete implementation file in the repository, instead of patches.
    gpu_only: its defect is out of the CPU suite's reach; killed on a GPU only.
    first: a property file to run before the rest of the suite. Speed only: the whole
        suite still runs until its first failure, so this credits no kill by itself.
    contract: the tier it is judged under: ``correct`` (the default for any --impl), or ``strict``
        where the defect breaks only a promise of this kernel's, not the contract.
    definition: the definition the suite tests it under (``--definition=NAME``); None: the seed's.
    """

    name: str
    defect_class: str
    rationale: str
    patches: tuple[Patch, ...] = ()
    file: str | None = None
    gpu_only: bool = False
    first: str | None = None
    contract: str = "correct"
    definition: str | None = None

    def __post_init__(self):
        if bool(self.patches) == bool(self.file):
            raise ValueError(f"mutant {self.name!r}: give either patches or file, not both or neither")
        if self.defect_class not in CLASSES:
            raise ValueError(f"mutant {self.name!r}: defect_class={self.defect_class!r} not in {CLASSES}")


CLASSES = (
    "lse base", "gqa head mapping", "online-softmax rescaling", "tail masking", "page indirection", "strides",
    "empty sequences", "extreme logits", "precision loss", "scale", "bad input", "int32 offsets", "last page",
    "head padding", "seed",
)

# Definitions the family's mutants run under: 64-token pages, and 20 query heads padded to 32 rows.
PAGED = "gqa_paged_decode_h20_kv4_d128_ps64"
PADDED = "gqa_paged_decode_h20_kv4_d128_ps1"

# Lines of the kernel that several mutants patch.
_MASKED_LOGITS = 'scores = tl.where(in_seq[None, :], scores * sm_scale, float("-inf"))'
_PAGE_LOAD = "page = tl.load(kv_indices_ptr + page_start + token // PAGE_SIZE, mask=in_seq, other=0).to(tl.int64)"
_NORMALISER = "l_i = l_i * alpha + tl.sum(p, 1)"
_LSE_STORE = "tl.store(lse_ptrs, m_i * LOG2E + tl.log2(l_i)"
_TOKENS = "(num_pages - 1) * PAGE_SIZE + last_len"
_INT32_PAGE_LOAD = "page = tl.load(kv_indices_ptr + page_start + token // PAGE_SIZE, mask=in_seq, other=0)"


def _kernel(old: str, new: str) -> tuple[Patch, ...]:
    return (Patch(KERNEL, old, new),)


def _launch(old: str, new: str) -> tuple[Patch, ...]:
    return (Patch(LAUNCH, old, new),)


DECODE_MUTANTS: tuple[Mutant, ...] = (
    # ---- LSE base ----
    Mutant("lse_natural_log", "lse base", "stores the natural-log LSE where the contract says base 2",
           _kernel(_LSE_STORE, "tl.store(lse_ptrs, m_i + tl.log(l_i)")),
    Mutant("lse_max_not_converted", "lse base", "adds the natural-log running max to a base-2 log of the sum",
           _kernel(_LSE_STORE, "tl.store(lse_ptrs, m_i + tl.log2(l_i)")),
    # ---- GQA head mapping ----
    Mutant("gqa_heads_interleaved", "gqa head mapping", "query head h reads KV head h % 4 instead of h // 8",
           _kernel("kv_head_of_q = offs_h // GROUP", "kv_head_of_q = offs_h % NUM_KV_HEADS")),
    Mutant("gqa_values_from_mirrored_head", "gqa head mapping",
           "P @ V reads V of KV head 3 - g: keys right, values from another head",
           _kernel("tl.cast(g, tl.int64) * stride_v_head", "tl.cast(NUM_KV_HEADS - 1 - g, tl.int64) * stride_v_head")),
    Mutant("gqa_scores_sum_all_kv_heads", "gqa head mapping",
           "forgets to zero the other groups' rows, so each logit sums q.k over all 4 KV heads",
           _kernel("q_g = tl.where((kv_head_of_q == g)[:, None], q, 0.0)", "q_g = q")),
    # ---- online-softmax rescaling ----
    Mutant("accumulator_not_rescaled", "online-softmax rescaling",
           "keeps the accumulator at the old max when a later block raises it (sequences > one block)",
           _kernel("acc = acc * alpha[:, None]", "acc = acc"),
           first="properties/test_edge_shapes.py"),
    Mutant("normaliser_not_rescaled", "online-softmax rescaling",
           "keeps the normaliser at the old max when a later block raises it (sequences > one block)",
           _kernel(_NORMALISER, "l_i = l_i + tl.sum(p, 1)"),
           first="properties/test_edge_shapes.py"),
    Mutant("rescale_factor_natural_base", "online-softmax rescaling",
           "rescale factor exp2(m_old - m_new) misses log2(e): a natural/base-2 mix-up across blocks",
           _kernel("alpha = tl.exp2((m_i - m_new) * LOG2E)", "alpha = tl.exp2(m_i - m_new)"),
           first="properties/test_edge_shapes.py"),
    # ---- tail masking ----
    Mutant("block_loop_off_by_one", "tail masking",
           "loops to seq_len - 1, dropping the last block when seq_len % 128 == 1 (1, 129, 257 tokens)",
           _kernel("range(0, seq_len, BLOCK_N)", "range(0, seq_len - 1, BLOCK_N)"),
           first="properties/test_edge_shapes.py"),
    Mutant("tail_logits_not_masked", "tail masking",
           "padding columns of the last block keep logit 0 and take softmax weight",
           _kernel(_MASKED_LOGITS, "scores = scores * sm_scale")),
    Mutant("tail_values_loaded_unmasked", "tail masking",
           "V of padding columns is read from page 0: NaN/Inf there leaks through a zero weight (0 * NaN)",
           _kernel("offs_d[None, :] * stride_v_d,\n                mask=in_seq[:, None], other=0.0,",
                   "offs_d[None, :] * stride_v_d,")),
    # ---- page indirection ----
    Mutant("page_table_ignored", "page indirection", "reads token t of every sequence from page t, ignoring kv_indices",
           _kernel(_PAGE_LOAD, "page = (token // PAGE_SIZE).to(tl.int64)")),
    Mutant("page_table_not_offset", "page indirection",
           "reads kv_indices from 0 for every sequence, forgetting kv_indptr[b] (batch >= 2)",
           _kernel("kv_indices_ptr + page_start + token", "kv_indices_ptr + token")),
    # ---- strides ----
    Mutant("q_batch_stride_assumed", "strides",
           "assumes q is contiguous (batch stride 32 * 128): wrong for q sliced from a fused QKV tensor",
           _kernel("q_ptr + seq * stride_q_b", "q_ptr + seq * NUM_QO_HEADS * HEAD_DIM"),
           first="properties/test_layouts.py"),
    Mutant("kv_last_dim_stride_assumed", "strides",
           "assumes unit stride along head_dim for K and V (the seed's defect)",
           (Patch(KERNEL, "offs_d[None, :] * stride_k_d", "offs_d[None, :]"),
            Patch(KERNEL, "offs_d[None, :] * stride_v_d", "offs_d[None, :]")),
           first="properties/test_layouts.py"),
    Mutant("v_page_stride_from_k", "strides",
           "addresses V pages with K's page stride: wrong when K and V layouts differ",
           _kernel("page * stride_v_page", "page * stride_k_page"),
           first="properties/test_layouts.py"),
    # ---- empty sequences ----
    Mutant("empty_sequence_not_special_cased", "empty sequences",
           "runs an empty sequence through the loop: 0 / 0 gives NaN output (the split-KV padding bug)",
           _kernel("if seq_len == 0:", "if seq_len < 0:")),
    Mutant("empty_sequence_lse_zero", "empty sequences", "writes LSE 0 instead of -inf for an empty sequence",
           _kernel('tl.store(lse_ptrs, tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)',
                   "tl.store(lse_ptrs, tl.zeros([BLOCK_H], dtype=tl.float32)")),
    Mutant("empty_sequence_output_unwritten", "empty sequences",
           "never stores the zero output of an empty sequence: it keeps whatever torch.empty held",
           _kernel("tl.store(out_ptrs, tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32).to(output_ptr.dtype.element_ty),"
                   "\n                 mask=is_head[:, None])\n        ", "")),
    # ---- extreme logits: finite sentinels, max initialisation ----
    Mutant("finite_mask_sentinel", "extreme logits",
           "masks padding with -5e4 (FlashInfer's bug): it dominates when every real logit is below it",
           _kernel(_MASKED_LOGITS, "scores = tl.where(in_seq[None, :], scores * sm_scale, -5.0e4)"),
           first="properties/test_hostile_values.py"),
    Mutant("max_initialised_finite", "extreme logits",
           "starts the running max at -1e4, not -inf: all weights underflow when every logit is far below",
           _kernel('m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)',
                   "m_i = tl.full([BLOCK_H], -1.0e4, dtype=tl.float32)"),
           first="properties/test_hostile_values.py"),
    Mutant("running_max_not_monotone", "extreme logits",
           "uses each block's own max, not the running max: exp overflows when an earlier block was far larger",
           _kernel("m_new = tl.maximum(m_i, tl.max(scores, 1))", "m_new = tl.max(scores, 1)"),
           first="properties/test_hostile_values.py"),
    # ---- precision loss ----
    Mutant("logits_rounded_to_bf16", "precision loss", "rounds q.k to bf16 before scaling (a bf16 score buffer)",
           _kernel("scores += tl.dot(q_g, tl.trans(k.to(tl.float32)))",
                   "scores += tl.dot(q_g, tl.trans(k.to(tl.float32))).to(tl.bfloat16).to(tl.float32)")),
    Mutant("normaliser_rounded_to_bf16", "precision loss", "keeps the softmax normaliser in bf16",
           _kernel(_NORMALISER, "l_i = (l_i * alpha + tl.sum(p, 1)).to(tl.bfloat16).to(tl.float32)")),
    Mutant("output_rounded_toward_zero", "precision loss",
           "rounds the output to bf16 toward zero (what Triton's interpreter does), not to nearest even",
           _kernel("(acc / l_i[:, None]).to(output_ptr.dtype.element_ty)",
                   '(acc / l_i[:, None]).to(output_ptr.dtype.element_ty, fp_downcast_rounding="rtz")')),
    # ---- scale ----
    Mutant("scale_ignored", "scale", "never multiplies the logits by sm_scale",
           _kernel(_MASKED_LOGITS, 'scores = tl.where(in_seq[None, :], scores, float("-inf"))')),
    Mutant("default_scale_one_over_head_dim", "scale", "defaults sm_scale to 1/128 instead of 1/sqrt(128)",
           _launch("return 1.0 / math.sqrt(head_dim)", "return 1.0 / head_dim")),
    Mutant("negative_scale_made_positive", "scale", "takes abs(sm_scale): a negative scale gives the wrong softmax",
           _launch("return float(sm_scale)", "return abs(float(sm_scale))"),
           first="properties/test_hostile_values.py"),
    # ---- bad input ----
    Mutant("indptr_monotonicity_unchecked", "bad input",
           "accepts a decreasing kv_indptr: a negative length silently gives NaN instead of a ValueError",
           _launch("if min_step < 0:", "if False:")),
    Mutant("nan_scale_accepted", "bad input", "tests sm_scale with isinf where isfinite is needed: NaN gets through",
           (Patch(LAUNCH, "if not math.isfinite(sm_scale):", "if math.isinf(sm_scale):"),
            Patch(LAUNCH, "if not math.isfinite(float(torch.tensor(float(sm_scale), dtype=torch.float32))):",
                  "if math.isinf(float(torch.tensor(float(sm_scale), dtype=torch.float32))):")),
           # The contract leaves a NaN scale to policy (refuse or compute); this kernel promises a ValueError.
           contract="strict"),
    # ---- the family: pages of several tokens, head counts that are not powers of two ----
    Mutant("last_page_length_short", "last page",
           "reads kv_last_page_len as the last slot's index: each sequence loses its last token",
           _kernel(_TOKENS, f"{_TOKENS} - 1"), definition=PAGED),
    Mutant("last_page_read_whole", "last page",
           "reads every slot of the last page: the unused slots' junk (NaN, Inf) joins the softmax",
           _kernel(_TOKENS, "num_pages * PAGE_SIZE"), definition=PAGED),
    Mutant("page_index_wrong_divisor", "page indirection",
           "divides the token index by the block size (128), not the page size (64), to find its page: "
           "sequences of more than one page read the wrong pages",
           _kernel("page_start + token // PAGE_SIZE", "page_start + token // BLOCK_N"), definition=PAGED),
    Mutant("kv_slot_stride_assumed", "strides",
           "assumes a page's slots are num_kv_heads * head_dim apart: wrong for a head-major or padded pool",
           (Patch(KERNEL, "slot * stride_k_slot", "slot * (NUM_KV_HEADS * HEAD_DIM)"),
            Patch(KERNEL, "slot * stride_v_slot", "slot * (NUM_KV_HEADS * HEAD_DIM)")),
           first="properties/test_layouts.py", definition=PAGED),
    Mutant("group_from_padded_heads", "head padding",
           "takes the group size from the padded head count (32 // 4 = 8, not 20 // 4 = 5): heads read the "
           "wrong KV heads",
           _kernel("NUM_QO_HEADS // NUM_KV_HEADS", "BLOCK_H // NUM_KV_HEADS"), definition=PADDED),
    # ---- GPU only ----
    Mutant("page_offset_int32", "int32 offsets",
           "page_id * page_stride in int32: wraps once page ids reach 2**22 (pools of >= 4.2M pages)",
           _kernel(_PAGE_LOAD, _INT32_PAGE_LOAD), gpu_only=True),
    Mutant("page_offset_int32_paged", "int32 offsets",
           "page_id * page_stride in int32 with 64-token pages (stride 32,768 elements): wraps from page 2**16 on "
           "(pools of >= 65,536 pages, 8.6 GB of K+V)",
           _kernel(_PAGE_LOAD, _INT32_PAGE_LOAD), gpu_only=True, definition=PAGED),
    Mutant("padded_heads_unmasked", "head padding",
           "masks heads against the padded count (32), not 20: the padded rows load the next sequence's q and "
           "store over its first 12 heads (a race on a GPU; in the interpreter programs run in order and the next "
           "one overwrites them, and the last program's rows land past the output)",
           _kernel("is_head = offs_h < NUM_QO_HEADS", "is_head = offs_h < BLOCK_H"), gpu_only=True, definition=PADDED),
    Mutant("seed_original", "seed",
           "the seed kernel and wrapper verbatim; on CPU its run() refuses to start without CUDA, so it is "
           "killed meaningfully only on a GPU (int32 offsets, unread last-dim strides, unchecked page ids)",
           file="tests/corpus/seed_original.py", gpu_only=True),
)


# The prefill kernel's planted defects, each under a prefill definition (the property suite's prefill properties).
from .prefill_mutants import PREFILL_MUTANTS  # noqa: E402 - it builds on Mutant and Patch above

MUTANTS: tuple[Mutant, ...] = DECODE_MUTANTS + PREFILL_MUTANTS


def by_name(name: str) -> Mutant:
    """The corpus entry called ``name``; KeyError lists the known names."""
    for mutant in MUTANTS:
        if mutant.name == name:
            return mutant
    raise KeyError(f"no mutant {name!r}; known: {', '.join(m.name for m in MUTANTS)}")
