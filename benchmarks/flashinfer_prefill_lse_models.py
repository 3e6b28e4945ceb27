"""Which rounding explains FlashInfer 0.3.1 prefill's LSE error: its LSE against float64 models (GPU, FlashInfer).

Each model computes the base-2 LSE in float64 from the same bf16 inputs, differing only in what is rounded
first: ``exact`` (the contract), ``q*scale bf16`` (q times sm_scale rounded to bf16 before Q.K),
``q*scale*log2e bf16`` (the same with log2 e folded in), and ``P bf16, tile T``: the normaliser summed over the
probabilities rounded to bf16 (as they go into the P.V product), online over key tiles of T, each tile's
probabilities relative to the running maximum; ``d bf16``: the normaliser itself rounded to bf16. It also
prints the exact and the closest model's error by how many keys a row sees (a rounding of each probability
shrinks with more keys; a rounding of the sum does not). The model whose max |difference| is at float32 noise
is what the kernel computes.

    PYTHONPATH=.carry/flashinfer python benchmarks/flashinfer_prefill_lse_models.py
"""

import math

import torch

from adapters import flashinfer_prefill
from adapters._paged import example_prefill_call
from gqa_decode_fuzz.reference import definitions


def _lse2(q: torch.Tensor, k: torch.Tensor, seen: int, group: int, log2_logits: bool) -> torch.Tensor:
    keys = k[:seen].double().repeat_interleave(group, dim=1)  # [n, H, D]
    logits = torch.einsum("hd,nhd->hn", q, keys)
    if log2_logits:
        logits = logits * math.log(2)
    return torch.logsumexp(logits, dim=1) / math.log(2)


def _lse2_bf16_p(q: torch.Tensor, k: torch.Tensor, seen: int, group: int, scale: float, tile: int) -> torch.Tensor:
    """The online softmax's base-2 LSE with each tile's probabilities rounded to bf16 before they are summed."""
    keys = k[:seen].double().repeat_interleave(group, dim=1)
    logits = (torch.einsum("hd,nhd->hn", q.double(), keys) * (scale / math.log(2))).float()
    running_max = torch.full(logits.shape[:1], -math.inf, dtype=torch.float32)
    total = torch.zeros(logits.shape[:1], dtype=torch.float32)
    for start in range(0, seen, tile):
        block = logits[:, start:start + tile]
        new_max = torch.maximum(running_max, block.max(dim=1).values)
        probabilities = torch.exp2(block - new_max[:, None]).bfloat16().float()
        total = total * torch.exp2(running_max - new_max) + probabilities.sum(dim=1)
        running_max = new_max
    return running_max.double() + torch.log2(total.double())


def _lse2_bf16_d(exact: torch.Tensor) -> torch.Tensor:
    """The LSE whose normaliser d (relative to the row maximum, which the exact LSE does not tell apart) is
    rounded to bf16: modelled as the exact LSE's fractional part in log2 rounded through bf16's 8-bit mantissa."""
    whole = torch.floor(exact)
    return whole + torch.log2(torch.exp2(exact - whole).bfloat16().double())


def _rows(q_lens: list[int], kv_lens: list[int], qo_indptr, kv_indptr):
    """(row, its sequence's keys' first index, keys it sees) for every row that sees a key."""
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        for i in range(q_len):
            seen = i + kv_len - q_len + 1
            if seen > 0:
                yield int(qo_indptr[b]) + i, int(kv_indptr[b]), seen


def main() -> None:
    definition = definitions.by_name("gqa_ragged_prefill_causal_h32_kv4_d128")
    q_lens, kv_lens = [1, 7, 64, 65, 3], [1, 7, 64, 300, 130]
    q, k, v, qo_indptr, kv_indptr, scale = example_prefill_call(definition, q_lens, kv_lens, seed=0)
    _, lse = flashinfer_prefill.run(q.cuda(), k.cuda(), v.cuda(), qo_indptr.cuda(), kv_indptr.cuda(), scale)
    lse = lse.double().cpu()
    group = definition.num_qo_heads // definition.num_kv_heads
    scaled = {"exact": (q.double() * scale, False),
              "q*scale bf16": ((q.float() * scale).bfloat16().double(), False),
              "q*scale*log2e bf16": ((q.float() * (scale / math.log(2))).bfloat16().double(), True)}

    def exact_like(scaled_q: torch.Tensor, log2_logits: bool):
        return lambda row, keys, seen: _lse2(scaled_q[row], keys, seen, group, log2_logits)

    def bf16_probabilities(tile: int):
        return lambda row, keys, seen: _lse2_bf16_p(q[row], keys, seen, group, scale, tile)

    models = {name: exact_like(*values) for name, values in scaled.items()}
    models["d bf16"] = lambda row, keys, seen: _lse2_bf16_d(models["exact"](row, keys, seen))
    models.update({f"P bf16, tile {tile}": bf16_probabilities(tile) for tile in (16, 32, 64, 128, 4096)})
    print(f"torch {torch.__version__}, flashinfer {flashinfer_prefill.flashinfer.__version__}, "
          f"{torch.cuda.get_device_name()}; sm_scale {scale}")
    errors: dict[str, list[tuple[int, torch.Tensor]]] = {name: [] for name in models}
    for row, first_key, seen in _rows(q_lens, kv_lens, qo_indptr, kv_indptr):
        keys = k[first_key:first_key + seen]
        for name, model in models.items():
            errors[name].append((seen, lse[row] - model(row, keys, seen)))
    worst = {name: max(e.abs().max().item() for _, e in rows) for name, rows in errors.items()}
    for name, value in worst.items():
        print(f"{name:>20}: max |flashinfer lse - model| = {value:.3g}")
    for name in ("exact", min(worst, key=worst.get)):
        print(f"{name} model, by keys seen: rows, median |err|, max |err|, mean signed err")
        for low, high in ((1, 1), (2, 7), (8, 64), (65, 128), (129, 300)):
            chosen = torch.cat([e for seen, e in errors[name] if low <= seen <= high])
            print(f"  {low:>3}-{high:<3} keys: {chosen.numel():>5} {chosen.abs().median().item():.3g} "
                  f"{chosen.abs().max().item():.3g} {chosen.mean().item():+.3g}")

if __name__ == "__main__":
    main()
