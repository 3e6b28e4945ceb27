"""The bad-input table: each way to break a valid call (``CORRUPTIONS``), drawn by ``corruptions``, and the
check that a broken call is refused as the contract tier demands (``assert_handled``); what the contract says is
in ``test_bad_input``'s docstring (docs/bad-input.md has the table in words).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from gqa_decode_fuzz.engine.destinations import DestinationError
from gqa_decode_fuzz.engine.isolation import ImplementationFailed
from gqa_decode_fuzz.generation.cases import DecodeInputs, active_definition, is_out_of_memory
from gqa_decode_fuzz.generation.strategies import SizeLimits

__all__ = ["CORRUPTIONS", "LIMITS", "NOT_A_REFUSAL", "Corruption", "assert_handled", "corruptions",
           "is_refusal"]

# Errors that refuse nothing where a refusal is allowed: a destination-passing call that wrote outside its
# destinations, and an isolated implementation's crash, hang, sanitizer error or late write (in-process a fault
# was no exception a claim could catch, and must not become one by isolating the implementation).
NOT_A_REFUSAL = (DestinationError, ImplementationFailed)


def is_refusal(error: Exception) -> bool:
    """Whether the implementation's exception may be read as refusing its call: not one of ``NOT_A_REFUSAL``, and
    not running out of memory (on a shared GPU the run's limit, which the runner reports as such; alone, a failure)."""
    return not isinstance(error, NOT_A_REFUSAL) and not is_out_of_memory(error)


# Validation does not depend on sizes: small cases keep the two calls per example cheap.
LIMITS = SizeLimits(max_batch=3, max_len=40, max_spare_pages=8)
INT32_MAX = 2**31 - 1


class Corruption(NamedTuple):
    """One way to break a valid call: the broken arguments, the error strict expects, the names it may cite."""

    apply: Callable[[DecodeInputs, torch.Generator], DecodeInputs]
    error: type[Exception]
    names: tuple[str, ...]
    applies: Callable[[DecodeInputs], bool] = lambda inputs: True
    forbidden: bool = True  # False: policy (refuse or compute) outside the strict tier


def _pick(gen: torch.Generator, count: int) -> int:
    return int(torch.randint(0, count, (1,), generator=gen))


def _other_device(device: torch.device) -> torch.device:
    return torch.device("cpu") if device.type == "cuda" else torch.device("meta")


def _set_page(inputs: DecodeInputs, gen: torch.Generator, page: int) -> DecodeInputs:
    indices = inputs.kv_indices.clone()
    indices[_pick(gen, indices.numel())] = page
    return inputs._replace(kv_indices=indices)


def _set_indptr(inputs: DecodeInputs, position: int, value: int) -> DecodeInputs:
    indptr = inputs.kv_indptr.clone()
    indptr[position] = value
    return inputs._replace(kv_indptr=indptr)


def _decreasable(inputs: DecodeInputs) -> list[int]:
    """Inner kv_indptr positions that can be moved so that kv_indptr decreases while staying in [0, total]."""
    indptr = inputs.kv_indptr.tolist()
    total = indptr[-1] if indptr else 0
    return [p for p in range(1, len(indptr) - 1) if indptr[p + 1] < total or indptr[p - 1] >= 1]


def _decreasing_indptr(inputs: DecodeInputs, gen: torch.Generator) -> DecodeInputs:
    """kv_indptr with one decrease and no boundary outside kv_indices: a kernel that skips the check computes
    garbage instead of reading past the buffer (which, in Triton's CPU interpreter, can kill the process)."""
    indptr = inputs.kv_indptr.tolist()
    positions = _decreasable(inputs)
    position = positions[_pick(gen, len(positions))]
    if indptr[position + 1] < indptr[-1]:
        return _set_indptr(inputs, position, indptr[-1])  # above the next boundary
    return _set_indptr(inputs, position, indptr[position - 1] - 1)  # below the previous one


def _move(name: str) -> Callable[[DecodeInputs, torch.Generator], DecodeInputs]:
    return lambda inputs, gen: inputs._replace(**{name: getattr(inputs, name).to(_other_device(inputs.q.device))})


def _has_pages(inputs: DecodeInputs) -> bool:
    return inputs.kv_indices.numel() > 0


def _pool_size(inputs: DecodeInputs) -> int:
    return inputs.k_cache.shape[0]


def _paged(inputs: DecodeInputs) -> bool:
    return inputs.kv_last_page_len is not None


def _paged_with_pages(inputs: DecodeInputs) -> bool:
    return _paged(inputs) and _has_pages(inputs)


def _set_last_page_len(inputs: DecodeInputs, gen: torch.Generator, value: int) -> DecodeInputs:
    """kv_last_page_len with ``value`` for one sequence that has pages."""
    indptr = inputs.kv_indptr.tolist()
    with_pages = [seq for seq in range(len(indptr) - 1) if indptr[seq + 1] > indptr[seq]]
    last = inputs.kv_last_page_len.clone()
    last[with_pages[_pick(gen, len(with_pages))]] = value
    return inputs._replace(kv_last_page_len=last)


def _page_size(inputs: DecodeInputs) -> int:
    return inputs.k_cache.shape[1]


CORRUPTIONS: dict[str, Corruption] = {
    # wrong dtype or type: TypeError
    "q_float16": Corruption(lambda x, g: x._replace(q=x.q.half()), TypeError, ("q",)),
    "q_float32": Corruption(lambda x, g: x._replace(q=x.q.float()), TypeError, ("q",)),
    "q_numpy": Corruption(lambda x, g: x._replace(q=x.q.float().cpu().numpy()), TypeError, ("q",)),
    "k_cache_float16": Corruption(lambda x, g: x._replace(k_cache=x.k_cache.half()), TypeError, ("k_cache",)),
    "v_cache_float32": Corruption(lambda x, g: x._replace(v_cache=x.v_cache.float()), TypeError, ("v_cache",)),
    "kv_indptr_float": Corruption(lambda x, g: x._replace(kv_indptr=x.kv_indptr.float()), TypeError, ("kv_indptr",)),
    "kv_indices_int16": Corruption(
        lambda x, g: x._replace(kv_indices=x.kv_indices.to(torch.int16)), TypeError, ("kv_indices",)),
    "sm_scale_string": Corruption(lambda x, g: x._replace(sm_scale="0.1"), TypeError, ("sm_scale",), forbidden=False),
    # wrong shape: ValueError
    "q_16_heads": Corruption(lambda x, g: x._replace(q=x.q[:, :x.q.shape[1] // 2]), ValueError, ("q",)),
    "q_head_dim_64": Corruption(lambda x, g: x._replace(q=x.q[..., :x.q.shape[2] // 2]), ValueError, ("q",)),
    "q_extra_dim": Corruption(lambda x, g: x._replace(q=x.q[None]), ValueError, ("q",)),
    "k_cache_page_size_2": Corruption(
        lambda x, g: x._replace(k_cache=torch.cat([x.k_cache, x.k_cache], 1)), ValueError, ("k_cache",)),
    "k_cache_8_heads": Corruption(
        lambda x, g: x._replace(k_cache=torch.cat([x.k_cache, x.k_cache], 2)), ValueError, ("k_cache",)),
    "v_cache_other_pool_size": Corruption(
        lambda x, g: x._replace(v_cache=torch.cat([x.v_cache, x.v_cache[:1]])), ValueError, ("v_cache",),
        applies=lambda x: _pool_size(x) > 0),
    "kv_indptr_short": Corruption(lambda x, g: x._replace(kv_indptr=x.kv_indptr[:-1]), ValueError, ("kv_indptr",)),
    "kv_indices_2d": Corruption(lambda x, g: x._replace(kv_indices=x.kv_indices[None]), ValueError, ("kv_indices",)),
    # wrong device: ValueError
    **{f"{name}_other_device": Corruption(_move(name), ValueError, (name, "q"), forbidden=False)
       for name in ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices")},
    "all_on_other_device": Corruption(  # cpu without the interpreter, or meta
        lambda x, g: x._replace(**{n: t.to(_other_device(x.q.device)) for n, t in x._asdict().items()
                                   if isinstance(t, torch.Tensor)}),
        ValueError, ("q",), forbidden=False),
    # inconsistent indices: ValueError
    "page_id_equal_to_pool_size": Corruption(
        lambda x, g: _set_page(x, g, _pool_size(x)), ValueError, ("kv_indices",), applies=_has_pages),
    "page_id_int32_max": Corruption(
        lambda x, g: _set_page(x, g, INT32_MAX), ValueError, ("kv_indices",), applies=_has_pages),
    "page_id_negative": Corruption(lambda x, g: _set_page(x, g, -1), ValueError, ("kv_indices",), applies=_has_pages),
    "page_id_int32_min": Corruption(
        lambda x, g: _set_page(x, g, -INT32_MAX - 1), ValueError, ("kv_indices",), applies=_has_pages),
    "kv_indptr_not_monotonic": Corruption(  # one sequence of negative length, every boundary within kv_indices
        _decreasing_indptr, ValueError, ("kv_indptr",), applies=lambda x: bool(_decreasable(x))),
    "kv_indptr_not_starting_at_0": Corruption(
        lambda x, g: x._replace(kv_indptr=x.kv_indptr + 1), ValueError, ("kv_indptr",)),
    "kv_indptr_past_kv_indices": Corruption(
        lambda x, g: _set_indptr(x, -1, x.kv_indices.numel() + 1), ValueError, ("kv_indptr", "kv_indices"),
        applies=lambda x: x.kv_indptr.numel() >= 2),
    "kv_indices_longer_than_kv_indptr_says": Corruption(
        lambda x, g: x._replace(kv_indices=torch.cat([x.kv_indices, x.kv_indices.new_zeros(1)])),
        ValueError, ("kv_indptr", "kv_indices"), applies=lambda x: _pool_size(x) > 0),
    # bad scale: ValueError
    "sm_scale_nan": Corruption(lambda x, g: x._replace(sm_scale=math.nan), ValueError, ("sm_scale",),
                               forbidden=False),
    "sm_scale_inf": Corruption(lambda x, g: x._replace(sm_scale=-math.inf), ValueError, ("sm_scale",),
                               forbidden=False),
    "sm_scale_beyond_float32": Corruption(lambda x, g: x._replace(sm_scale=1e39), ValueError, ("sm_scale",),
                                          forbidden=False),
}
_ONE_TOKEN_PAGES = sorted(CORRUPTIONS)
# Pages of several tokens: kv_last_page_len broken too.
CORRUPTIONS.update({
    "kv_last_page_len_missing": Corruption(
        lambda x, g: x._replace(kv_last_page_len=None), TypeError, ("kv_last_page_len",), applies=_paged),
    "kv_last_page_len_float": Corruption(
        lambda x, g: x._replace(kv_last_page_len=x.kv_last_page_len.float()), TypeError, ("kv_last_page_len",),
        applies=_paged),
    "kv_last_page_len_short": Corruption(
        lambda x, g: x._replace(kv_last_page_len=x.kv_last_page_len[:-1]), ValueError, ("kv_last_page_len",),
        applies=lambda x: _paged(x) and x.kv_last_page_len.numel() > 0),
    "kv_last_page_len_above_page_size": Corruption(
        lambda x, g: _set_last_page_len(x, g, _page_size(x) + 1), ValueError, ("kv_last_page_len",),
        applies=_paged_with_pages),
    "kv_last_page_len_negative": Corruption(
        lambda x, g: _set_last_page_len(x, g, -1), ValueError, ("kv_last_page_len",), applies=_paged_with_pages),
    "kv_last_page_len_zero": Corruption(
        lambda x, g: _set_last_page_len(x, g, 0), ValueError, ("kv_last_page_len",), applies=_paged_with_pages,
        forbidden=False),
    "kv_last_page_len_other_device": Corruption(
        _move("kv_last_page_len"), ValueError, ("kv_last_page_len", "q"), applies=_paged, forbidden=False),
})
# Drawn per definition, the one-token-page list unchanged (a derandomized run draws the same corruptions).
_DRAWN = {False: st.sampled_from(_ONE_TOKEN_PAGES), True: st.sampled_from(sorted(CORRUPTIONS))}


@st.composite
def corruptions(draw) -> str:
    """The name of one corruption the active definition's calls can take."""
    return draw(_DRAWN[active_definition().paged])


def assert_handled(impl, contract: str, inputs: DecodeInputs, corruption: str, where: int, context: str) -> None:
    """The call broken by ``corruption`` is refused as the tier demands (see test_bad_input's docstring)."""
    __tracebackhide__ = True
    broken = CORRUPTIONS[corruption]
    call = broken.apply(inputs, torch.Generator().manual_seed(where))
    if contract != "strict":
        try:
            impl(*call)
        except Exception as error:  # noqa: BLE001 - any exception: how to refuse is the kernel's choice
            if not is_refusal(error):
                raise
            return
        assert not broken.forbidden, f"{context}, {corruption}: the call the contract forbids was not refused"
        return  # a call left to policy: refused or computed, both allowed
    # An AssertionError naming the corruption and the error expected, as the claim's other checks fail (pytest.raises'
    # Failed, a BaseException, once escaped the cause probes; they now read it too).
    try:
        impl(*call)
    except broken.error as error:
        message = str(error)
    else:
        raise AssertionError(f"{context}, {corruption}: the call was not refused with {broken.error.__name__}")
    assert any(name in message for name in broken.names), (
        f"{context}, {corruption}: the error names none of {broken.names}: {message!r}"
    )
