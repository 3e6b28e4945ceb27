"""The project's causal prefill kernel against a naive float64 computation, within the decode oracle's bound.

The expected rows come from ``_naive``: per sequence, float64 logits over the sequence's keys (taken from the
token lists the case was built from, not from the pool), the bottom-right causal mask, a softmax. The bound is
the decode oracle's (``reference.oracle.attend``): a prefill row is a decode query over the keys it sees, so each
row is handed to it as a sequence of its own over the same pool (``_rows_as_decode``), and the oracle's float64
answer must agree with the naive one. A row that sees no key has bound 0: output 0 and LSE -inf exactly.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from itertools import accumulate

import pytest
import torch

from gqa_decode_fuzz.reference.compare import compare_all, raise_if_any
from gqa_decode_fuzz.reference.oracle import attend, float32_scale

# (query heads, KV heads, head dim, page size or None for ragged): every prefill definition's constants.
PAGED = [(16, 1, 128, 64), *[(h, kv, 128, ps) for h, kv in ((16, 2), (20, 4), (24, 4), (24, 8), (32, 16), (32, 4),
                                                             (32, 8), (5, 1), (6, 1)) for ps in (1, 64)],
         (40, 10, 128, 1)]
RAGGED = [(h, kv, 128, None) for h, kv in ((16, 1), (16, 2), (20, 4), (24, 8), (32, 16), (32, 4), (32, 8), (40, 10),
                                           (5, 1), (6, 1))] + [(8, 1, 256, None)]
# (q_len, kv_len): one query; a fresh prefill; more queries than keys (the first rows see nothing); no queries;
# no keys; a short chunk after a long prefix (two pages of 64 and a partial third, two key blocks).
MIXED = ((1, 9), (5, 5), (6, 3), (0, 4), (2, 0), (3, 130))


def _shape_id(shape) -> str:
    heads, kv_heads, dim, page = shape
    return f"h{heads}_kv{kv_heads}_d{dim}_" + ("ragged" if page is None else f"ps{page}")


@dataclass(frozen=True)
class Case:
    lengths: tuple[tuple[int, int], ...]  # (q_len, kv_len) per sequence
    scale: float | None = None
    values: str = "normal"  # or "below_1e5": every logit below -1e5, exact in float32
    spare_pages: int = 2
    seed: int = 0


class Built:
    """A case's tensors: the call's arguments, and the per-sequence token lists they were made from."""

    def __init__(self, shape, case: Case, device: torch.device):
        heads, kv_heads, dim, page = shape
        generator = torch.Generator().manual_seed(case.seed)
        q_lens, kv_lens = zip(*case.lengths)
        total_q = sum(q_lens)
        self.q = self._values(case.values, "q", (total_q, heads, dim), generator)
        self.keys = [self._values(case.values, "k", (n, kv_heads, dim), generator) for n in kv_lens]
        self.vals = [self._values(case.values, "v", (n, kv_heads, dim), generator) for n in kv_lens]
        self.q_lens, self.kv_lens, self.page, self.device = q_lens, kv_lens, page, device
        self.qo_indptr = torch.tensor([0, *accumulate(q_lens)], dtype=torch.int32)
        if page is None:
            self.k, self.v = torch.cat(self.keys), torch.cat(self.vals)
            self.kv_indptr = torch.tensor([0, *accumulate(kv_lens)], dtype=torch.int32)
            self.page_ids = [list(range(int(s), int(s) + n)) for s, n in zip(self.kv_indptr, kv_lens)]
        else:
            self._paginate(case, page, kv_heads, dim, generator)
        self.scale = case.scale

    @staticmethod
    def _values(kind: str, role: str, size, generator) -> torch.Tensor:
        if kind == "normal":
            return torch.randn(size, generator=generator).bfloat16()
        # q = 1 but 0.25 in dim 0, K = -1000 but -1000 + 4 m (m in -2..2) in dim 0: with scale 1 the logits are
        # -1000 (D - 1) - 250 + m, exact in float32 (quarter integers below 2**17), below -1e5 at head dim 128.
        if role == "q":
            q = torch.ones(size)
            q[..., 0] = 0.25
            return q.bfloat16()
        if role == "k":
            k = torch.full(size, -1000.0)
            k[..., 0] += 4 * torch.randint(-2, 3, size[:-1], generator=generator)
            return k.bfloat16()
        return (2 + 0.25 * torch.randn(size, generator=generator)).bfloat16()

    def _paginate(self, case: Case, page: int, kv_heads: int, dim: int, generator) -> None:
        counts = [-(-n // page) for n in self.kv_lens]
        pool = sum(counts) + case.spare_pages
        order = torch.randperm(pool, generator=generator).tolist()  # shuffled page ids
        self.k = torch.full((pool, page, kv_heads, dim), math.nan).bfloat16()  # junk: spare pages, unused slots
        self.v = torch.full((pool, page, kv_heads, dim), math.nan).bfloat16()
        self.page_ids, start = [], 0
        for b, n in enumerate(self.kv_lens):
            ids = order[start:start + counts[b]]
            start += counts[b]
            self.page_ids.append(ids)
            for j in range(n):
                self.k[ids[j // page], j % page] = self.keys[b][j]
                self.v[ids[j // page], j % page] = self.vals[b][j]
        self.kv_indptr = torch.tensor([0, *accumulate(counts)], dtype=torch.int32)
        self.kv_indices = torch.tensor(sum(self.page_ids, []), dtype=torch.int32)
        self.kv_last_page_len = torch.tensor([n - (c - 1) * page if c else 0 for n, c in zip(self.kv_lens, counts)],
                                             dtype=torch.int32)

    def arguments(self) -> list:
        """The call's arguments in order, sm_scale last, on the device."""
        on = self.device
        if self.page is None:
            tensors = [self.q, self.k, self.v, self.qo_indptr, self.kv_indptr]
        else:
            tensors = [self.q, self.k, self.v, self.qo_indptr, self.kv_indptr, self.kv_indices]
            if self.page > 1:
                tensors.append(self.kv_last_page_len)
        return [t.to(on) for t in tensors] + [self.scale]


def _limits(q_len: int, kv_len: int) -> list[int]:
    """Keys each query row sees: query i sees keys j <= i + kv_len - q_len (none when that is negative)."""
    return [max(0, i + kv_len - q_len + 1) for i in range(q_len)]


def _naive(built: Built, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 masked softmax per sequence, from the token lists: output [total_q, H, D] and base-2 lse."""
    heads, dim = built.q.shape[1:]
    output = torch.zeros(built.q.shape, dtype=torch.float64)
    lse = torch.full(built.q.shape[:2], -math.inf, dtype=torch.float64)
    row = 0
    for q_len, kv_len, keys, values in zip(built.q_lens, built.kv_lens, built.keys, built.vals):
        group = heads // keys.shape[1] if kv_len else 1
        q = built.q[row:row + q_len].double()
        if kv_len and q_len:
            k = keys.double().repeat_interleave(group, dim=1)  # [L, H, D]
            v = values.double().repeat_interleave(group, dim=1)
            logits = torch.einsum("qhd,khd->hqk", q, k) * scale
            seen = torch.arange(kv_len)[None, :] < torch.tensor(_limits(q_len, kv_len))[:, None]
            logits = logits.masked_fill(~seen, -math.inf)
            has_key = seen.any(dim=1)
            weights = torch.softmax(logits[:, has_key], dim=-1)
            output[row:row + q_len][has_key] = torch.einsum("hqk,khd->qhd", weights, v)
            lse[row:row + q_len][has_key] = (torch.logsumexp(logits[:, has_key], dim=-1) / math.log(2.0)).T
        row += q_len
    return output, lse


def _rows_as_decode(built: Built, args: list, scale: float):
    """The decode oracle's answer and bound, each query row a decode sequence over the keys it sees."""
    q, k, v = args[:3]
    page = built.page or 1
    if built.page is None:
        k, v = k.unsqueeze(1), v.unsqueeze(1)  # ragged rows are pages of one token
    indptr, indices, lasts = [0], [], []
    for q_len, kv_len, ids in zip(built.q_lens, built.kv_lens, built.page_ids):
        for seen in _limits(q_len, kv_len):
            pages = -(-seen // page)
            indices += ids[:pages]
            indptr.append(len(indices))
            lasts.append(seen - (pages - 1) * page if pages else 0)
    device = q.device
    as_tensor = dict(dtype=torch.int32, device=device)
    last = torch.tensor(lasts, **as_tensor) if page > 1 else None
    return attend(q, k, v, torch.tensor(indptr, **as_tensor), torch.tensor(indices, **as_tensor), scale, last)


def check(run, shape, case: Case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``run`` on ``case`` and assert it within the oracle's bound of the naive rows; returns its results."""
    built = Built(shape, case, device)
    args = built.arguments()
    output, lse = run(*args)
    scale = float32_scale(case.scale, shape[2])
    expected, expected_lse = _naive(built, scale)
    reference = _rows_as_decode(built, args, scale)
    torch.testing.assert_close(reference.output.cpu(), expected, rtol=1e-9, atol=1e-12)  # the translation is right
    torch.testing.assert_close(reference.lse.cpu(), expected_lse, rtol=1e-9, atol=1e-12)
    mismatches = compare_all([("output", output, expected.to(device), reference.output_bound),
                              ("lse", lse, expected_lse.to(device), reference.lse_bound)])
    raise_if_any(mismatches, f"{_shape_id(shape)} {case}")
    return output, lse


def _kernel(shape):
    # imported after the device fixture has switched the interpreter on (CPU)
    from gqa_decode_fuzz.kernel import for_prefill

    heads, kv_heads, dim, page = shape
    return for_prefill(heads, kv_heads, dim, page, page is None)


@pytest.mark.parametrize("shape", [pytest.param(s, id=_shape_id(s)) for s in PAGED + RAGGED])
def test_each_prefill_shape_matches_the_oracle(shape, device):
    check(_kernel(shape), shape, Case(MIXED, seed=sum(shape[:3])), device)


def _empty_rows(lengths) -> list[int]:
    rows, start = [], 0
    for q_len, kv_len in lengths:
        rows += [start + i for i, seen in enumerate(_limits(q_len, kv_len)) if not seen]
        start += q_len
    return rows


@pytest.mark.parametrize("shape", [(32, 4, 128, 64), (5, 1, 128, None)], ids=_shape_id)
def test_rows_that_see_no_key_are_exactly_zero_and_minus_infinity(shape, device):
    lengths = ((6, 3), (2, 0), (9, 1))
    output, lse = check(_kernel(shape), shape, Case(lengths, seed=4), device)
    empty = _empty_rows(lengths)
    assert len(empty) == 3 + 2 + 8
    assert torch.equal(output[empty].float().cpu(), torch.zeros(len(empty), *output.shape[1:]))
    assert bool((lse[empty] == -math.inf).all()), lse[empty]


CASES = {
    # tiles straddle the diagonal: 40 x 8 rows are five tiles of 64, each across a key block edge
    "fresh_prefill_many_tiles": ((32, 4, 128, 64), Case(((40, 40), (1, 1)), seed=5)),
    "chunk_after_long_prefix": ((32, 8, 128, 1), Case(((4, 200), (3, 64)), seed=6)),
    "partial_last_page_and_junk": ((16, 1, 128, 64), Case(((2, 65), (1, 127), (3, 128)), spare_pages=4, seed=7)),
    "d256_ragged": ((8, 1, 256, None), Case(((7, 40), (3, 3), (1, 0)), seed=8)),
    "sm_scale_zero": ((24, 4, 128, 64), Case(((5, 70), (2, 2)), scale=0.0, seed=9)),
    "logits_below_minus_1e5": ((20, 4, 128, 64), Case(((4, 70), (3, 3)), scale=1.0, values="below_1e5", seed=10)),
    "logits_below_minus_1e5_ragged": ((6, 1, 128, None), Case(((5, 9),), scale=1.0, values="below_1e5", seed=11)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_named_cases_match_the_oracle(name, device):
    shape, case = CASES[name]
    check(_kernel(shape), shape, case, device)


def test_sm_scale_zero_weighs_the_seen_keys_alike(device):
    shape, case = CASES["sm_scale_zero"]
    output, lse = check(_kernel(shape), shape, case, device)
    built = Built(shape, case, torch.device("cpu"))
    seen = _limits(5, 70)[0]  # query 0 of sequence 0 sees keys 0 .. 65
    first = built.vals[0][:seen].double().mean(dim=0).repeat_interleave(6, dim=0)
    assert torch.allclose(output[0].double().cpu(), first, atol=2e-2)
    assert lse[0, 0].item() == pytest.approx(math.log2(seen), abs=1e-5)


def test_no_queries_at_all(device):
    run = _kernel((32, 4, 128, 64))
    for lengths in (((0, 5), (0, 0)), ()):
        built = Built((32, 4, 128, 64), Case(lengths or ((0, 0),)), device)
        args = built.arguments()
        if not lengths:  # B = 0
            args[3], args[4] = torch.zeros(1, dtype=torch.int32, device=device), args[4][:1]
            args[5], args[6] = args[5][:0], args[6][:0]
        output, lse = run(*args)
        assert output.shape == (0, 32, 128) and lse.shape == (0, 32)


# ---- refusals ----

def _paged_args(device) -> list:
    return Built((32, 4, 128, 64), Case(((2, 65), (1, 3)), spare_pages=1), device).arguments()


def _ragged_args(device) -> list:
    return Built((8, 1, 256, None), Case(((2, 5), (1, 3))), device).arguments()


def _int(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


BAD = [
    ("paged", 0, lambda a, d: a[0].float(), TypeError, "q must have dtype torch.bfloat16"),
    ("paged", 0, lambda a, d: a[0][:, :16], ValueError, r"q must have shape \[\*, 32, 128\]"),
    ("paged", 1, lambda a, d: a[1][:, :1], ValueError, r"k_cache must have shape \[\*, 64, 4, 128\]"),
    ("paged", 3, lambda a, d: [0, 2, 3], TypeError, "qo_indptr must be a torch.Tensor, got list"),
    ("paged", 3, lambda a, d: a[3].float(), TypeError, "qo_indptr must have dtype"),
    ("paged", 3, lambda a, d: _int([0, 3, 2], d), ValueError, "qo_indptr must be non-decreasing"),
    ("paged", 3, lambda a, d: _int([0, 2, 4], d), ValueError, r"qo_indptr\[-1\]=4 must equal the length of q \(3\)"),
    ("paged", 3, lambda a, d: _int([1, 2, 3], d), ValueError, r"qo_indptr must start at 0"),
    ("paged", 3, lambda a, d: a[3][:0], ValueError, r"qo_indptr must have shape \[B \+ 1\]"),
    ("paged", 4, lambda a, d: a[4][:2], ValueError, r"kv_indptr must have shape \[3\]"),
    ("paged", 5, lambda a, d: a[5] + 10, ValueError, r"kv_indices must lie in \[0, 4\)"),
    ("paged", 6, lambda a, d: _int([65, 3], d), ValueError, r"kv_last_page_len must lie in \[0, 64\]"),
    ("paged", 6, lambda a, d: _int([0, 3], d), ValueError, r"kv_last_page_len\[0\]=0 but sequence 0 has pages"),
    ("paged", 7, lambda a, d: math.inf, ValueError, "sm_scale must be finite"),
    ("ragged", 1, lambda a, d: a[1][:, :, :128], ValueError, r"k must have shape \[\*, 1, 256\]"),
    ("ragged", 2, lambda a, d: a[2][:-1], ValueError, r"v must have shape \[8, 1, 256\]"),
    ("ragged", 4, lambda a, d: _int([0, 5, 9], d), ValueError, r"kv_indptr\[-1\]=9 must equal the length of k \(8\)"),
    ("ragged", 4, lambda a, d: _int([0, 6, 8], d)[[0, 2, 1]], ValueError, "kv_indptr must be non-decreasing"),
]


@pytest.mark.parametrize(("layout", "position", "change", "error", "message"), BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_call_is_refused_naming_the_argument_before_launching(layout, position, change, error, message,
                                                                    device, monkeypatch):
    import kernel._prefill_launch as launch

    args = _paged_args(device) if layout == "paged" else _ragged_args(device)
    run = _kernel((32, 4, 128, 64) if layout == "paged" else (8, 1, 256, None))
    args[position] = change(args, device)

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("launched a call it should have refused")

    monkeypatch.setattr(launch, "gqa_causal_prefill_kernel", NoLaunch())
    with pytest.raises(error, match=message):
        run(*args)


# ---- serving definitions ----

@dataclass(frozen=True)
class _Definition:
    name: str
    op_type: str | None
    num_qo_heads: int = 32
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 64


@pytest.mark.parametrize(("definition", "arguments"), [
    (_Definition("gqa_paged_prefill_causal_h32_kv4_d128_ps64", "gqa_paged"),
     ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")),
    (_Definition("gqa_paged_prefill_causal_h32_kv4_d128_ps1", "gqa_paged_prefill", page_size=1),
     ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "sm_scale")),
    (_Definition("gqa_ragged_prefill_causal_h8_kv1_d256", "gqa_ragged", 8, 1, 256),
     ("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale")),
    (_Definition("gqa_ragged_prefill_causal_h8_kv1_d256", None, 8, 1, 256),
     ("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale")),
])
def test_for_definition_serves_prefill_definitions_by_op_type(definition, arguments):
    import inspect

    from gqa_decode_fuzz.kernel import for_definition, for_prefill

    served = for_definition(definition)
    assert tuple(inspect.signature(served).parameters) == arguments
    ragged = "ragged" in arguments[1] or arguments[1] == "k"
    page = None if ragged else definition.page_size
    assert served is for_prefill(definition.num_qo_heads, definition.num_kv_heads, definition.head_dim, page, ragged)


def test_for_definition_still_serves_decode_and_refuses_other_op_types():
    from gqa_decode_fuzz.kernel import for_definition, run

    decode = _Definition("gqa_paged_decode_h32_kv4_d128_ps1", "gqa_paged", page_size=1)
    assert for_definition(decode) is run
    with pytest.raises(ValueError, match="definition 'mla_x' has op_type 'mla_paged'"):
        for_definition(_Definition("mla_x", "mla_paged"))
    with pytest.raises(ValueError, match="definition 'gqa_ragged_prefill_causal_h30_kv4_d128' is not supported by "
                                         "this kernel: num_qo_heads=30 is not a multiple of num_kv_heads=4"):
        for_definition(_Definition("gqa_ragged_prefill_causal_h30_kv4_d128", "gqa_ragged", 30))
    with pytest.raises(ValueError, match="head_dim=96 is not a power of two"):
        for_definition(_Definition("gqa_paged_prefill_causal_h32_kv4_d96_ps64", "gqa_paged", head_dim=96))


# ---- planted mutants: each must fail the checks above ----

def _mutant_for_prefill(mutant, directory):
    from tests.corpus.materialise import materialise_package

    shim = materialise_package(mutant.name, mutant.patches, directory)
    spec = importlib.util.spec_from_file_location(shim.stem, shim)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._module.for_prefill


def _catches(for_prefill, device) -> list[str]:
    """The checks of this file that fail for ``for_prefill``'s kernels (a few cases of each kind)."""
    caught = []
    probes = [((32, 4, 128, 64), Case(MIXED, seed=1)), ((5, 1, 128, None), Case(MIXED, seed=2)),
              CASES["fresh_prefill_many_tiles"], CASES["partial_last_page_and_junk"],
              CASES["logits_below_minus_1e5"]]
    for shape, case in probes:
        heads, kv_heads, dim, page = shape
        try:
            check(for_prefill(heads, kv_heads, dim, page, page is None), shape, case, device)
        except AssertionError as failure:
            caught.append(f"{_shape_id(shape)}: {str(failure).splitlines()[-1][:120]}")
    return caught


def test_each_planted_prefill_mutant_is_caught(device, tmp_path):
    from tests.corpus.prefill_mutants import PREFILL_MUTANTS

    for mutant in PREFILL_MUTANTS:
        assert _catches(_mutant_for_prefill(mutant, tmp_path), device), f"mutant {mutant.name} survives"
