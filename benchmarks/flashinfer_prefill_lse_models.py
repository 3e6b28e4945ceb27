"""Which rounding explains FlashInfer 0.3.1 prefill's LSE error: its LSE against float64 models (GPU, FlashInfer).

Each model computes the base-2 LSE in float64 from the same bf16 inputs, differing only in what is rounded
first: ``exact`` (the contract), ``q*scale bf16`` (q times sm_scale rounded to bf16 before Q.K),
``q*scale*log2e bf16`` (the same with log2 e folded in), and ``P bf16, tile T``: the normaliser summed over the
probabilities rounded to bf16 (as they go into the P.V product), online over key tiles of T, each tile's
probabilities relative to the running maximum. The model whose max |difference| is at float32 noise is what the
kernel computes.

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


def main() -> None:
    definition = definitions.by_name("gqa_ragged_prefill_causal_h32_kv4_d128")
    q_lens, kv_lens = [1, 7, 64, 65, 3], [1, 7, 64, 300, 130]
    q, k, v, qo_indptr, kv_indptr, scale = example_prefill_call(definition, q_lens, kv_lens, seed=0)
    _, lse = flashinfer_prefill.run(q.cuda(), k.cuda(), v.cuda(), qo_indptr.cuda(), kv_indptr.cuda(), scale)
    lse = lse.double().cpu()
    group = definition.num_qo_heads // definition.num_kv_heads
    models = {
        "exact": (q.double() * scale, False),
        "q*scale bf16": ((q.float() * scale).bfloat16().double(), False),
        "q*scale*log2e bf16": ((q.float() * (scale / math.log(2))).bfloat16().double(), True),
    }
    print(f"torch {torch.__version__}, flashinfer {flashinfer_prefill.flashinfer.__version__}, "
          f"{torch.cuda.get_device_name()}; sm_scale {scale}")
    tiles = (16, 32, 64, 128, 4096)
    for name in [*models, *(f"P bf16, tile {tile}" for tile in tiles)]:
        worst = 0.0
        for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
            for i in range(q_len):
                seen = i + kv_len - q_len + 1
                if seen <= 0:
                    continue
                row = int(qo_indptr[b]) + i
                keys = k[int(kv_indptr[b]):int(kv_indptr[b]) + kv_len]
                if name in models:
                    scaled_q, log2_logits = models[name]
                    model = _lse2(scaled_q[row], keys, seen, group, log2_logits)
                else:
                    model = _lse2_bf16_p(q[row], keys, seen, group, scale, int(name.rsplit(" ", 1)[1]))
                worst = max(worst, (lse[row] - model).abs().max().item())
        print(f"{name:>20}: max |flashinfer lse - model| = {worst:.3g}")


if __name__ == "__main__":
    main()
