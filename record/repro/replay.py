"""Replay a saved failure: ``python -m gqa_decode_fuzz.record.repro FILE [--device cpu|cuda] [--impl TARGET]``.

Loads a case file written by the suite (``failures/*.pt``), runs the implementation
on the recorded inputs (same values, shapes and strides) on the chosen device (in a
child process, as the suite does, for all but this project's own kernel: ``--isolation``),
compares with the float64 oracle and prints what is off: which sequences, heads and
dims, by how much against the bound, and the layout of the call in words. Writes a
heatmap of err/bound next to the case file. Exits 1 when the failure reproduces (a
sticky CUDA error anywhere in the replay counts: the case faulted again), 0 when every
recorded call was replayed and is within bound, 2 on bad arguments, 3 when nothing
reproduced but not everything was replayed (a call the file cannot rebuild, or none recorded).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]

_CALL_ARGUMENTS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len", "sm_scale")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gqa_decode_fuzz.record.repro", description=__doc__.splitlines()[0])
    parser.add_argument("file", metavar="FILE", type=Path, help="a case file under failures/")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to replay: cuda, cpu (Triton interpreter), auto (cuda when available)")
    parser.add_argument("--impl", metavar="TARGET", default=None,
                        help="implementation to replay against (default: the one that failed)")
    parser.add_argument("--isolation", choices=("auto", "on", "off"), default="auto",
                        help="auto (default): the implementation in a child process unless it is this project's "
                             "kernel, which cannot then rewrite the replay's oracle or comparison; off: in-process")
    parser.add_argument("--png", metavar="PATH", type=Path, default=None,
                        help="where to write the err/bound heatmap (default: next to FILE)")
    parser.add_argument("--no-png", action="store_true", help="write no heatmap")
    return parser


def _header(payload: dict, device, impl_spec: str) -> list[str]:
    from gqa_decode_fuzz.engine.examples import SHRINK_CUT
    from gqa_decode_fuzz.record.casefiles import device_name, versions

    then = payload["versions"]
    now = versions()
    changed = [f"{name} {then.get(name)} -> {now[name]}" for name in now if then.get(name) != now[name]]
    error = (payload.get("error") or "").strip().splitlines()
    cut = [line for line in error if line.startswith(SHRINK_CUT)]  # the case file's error ends with it
    return [
        f"property : {payload['nodeid']}",
        f"case     : {payload.get('case_repr') or 'not built from a DecodeCase'}",
        f"contract : {(payload.get('definition') or {}).get('name', 'gqa_paged_decode_h32_kv4_d128_ps1')}",
        f"found on : {payload['device_name']}, profile {payload['profile']}, "
        f"{payload['created']}",
        f"impl     : {payload['impl']}" + (f" (replaying {impl_spec})" if impl_spec != payload["impl"] else ""),
        f"replay on: {device_name(device)}" + (f"; versions differ: {', '.join(changed)}" if changed else ""),
        f"error    : {error[0] if error else '-'}",
        *(f"           {line}" for line in error[1:8]),
        *(f"shrink   : {line.removeprefix('gqa-decode: ')}" for line in cut),
    ]


def _solution_lines(recorded: dict | None, target) -> list[str]:
    """The Solution file the run tested, and whether the one replayed is the same file."""
    if recorded is None:
        return []
    now = target.solution
    said = [f"solution : {recorded['name']} (sha256 {recorded['sha256'][:12]})"]
    if now is None or now.sha256 != recorded["sha256"]:
        which = f"sha256 {now.sha256[:12]}" if now is not None else "not a Solution file"
        said.append(f"           replaying another implementation than the run tested: {which}")
    return said


def _replay_call(number: int, call: dict, impl, device, png: Path | None, title: str, case) -> bool | None:
    """Replay one recorded call; print its layout and diagnosis; True when it fails, None when the file
    cannot rebuild it."""
    from gqa_decode_fuzz import reference
    from gqa_decode_fuzz.record.casefiles import CaseFileError, restore_call

    from .diagnosis import (
        describe_layout,
        describe_mismatch,
        ratios,
        sequence_lengths,
        write_heatmap,
    )

    try:
        args, kwargs = restore_call(call, device, case)
    except CaseFileError as error:
        print(f"\n-- call {number}: cannot be replayed from the file: {error}")
        return None
    prefill = getattr(case, "q_lens", None) is not None
    print(f"\n-- call {number}: layout" + (" (causal prefill: described by its case above)" if prefill else ""))
    # Keyword arguments beyond the call's own (knobs, a DPS call's destination layout) are said, not described.
    said = {name: value for name, value in kwargs.items() if name not in _CALL_ARGUMENTS}
    for line in () if prefill else describe_layout(*args, **{k: v for k, v in kwargs.items() if k in _CALL_ARGUMENTS}):
        print(f"   {line}")
    for name, value in said.items():
        print(f"   {name}={value!r}")
    try:
        output, lse = impl(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - an implementation's exception is a finding, not a crash
        print(f"-- call {number}: the implementation raised {type(error).__name__}: {error}")
        return True
    if prefill:  # a causal prefill call: the suite's order is PrefillInputs'
        return _prefill_verdict(number, args, kwargs, output, lse)
    known = dict(zip(("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale", "kv_last_page_len"), args))
    known.update({k: v for k, v in kwargs.items() if k in ("sm_scale", "kv_last_page_len")})
    reference = reference.attend(*args[:5], known.get("sm_scale"), known.get("kv_last_page_len"))
    lengths = sequence_lengths(known["kv_indptr"], known.get("kv_last_page_len"), known["k_cache"].shape[1])
    group = known["q"].shape[1] // known["k_cache"].shape[2]
    lines, failed = describe_mismatch(output, lse, reference, lengths, group)
    print(f"-- call {number}: result against the float64 oracle")
    for line in lines:
        print(f"   {line}")
    if png is not None and output.shape == reference.output.shape and lse.shape == reference.lse.shape:
        try:
            print(f"   heatmap: {write_heatmap(png, *ratios(output, lse, reference), title)}")
        except ImportError:
            print("   no heatmap: matplotlib is not installed")
    return failed


def _prefill_verdict(number: int, args: tuple, kwargs: dict, output, lse) -> bool:
    """A replayed causal prefill call against the prefill oracle, row by row: the suite's one comparison and its
    mismatch report; True when it fails."""
    from gqa_decode_fuzz.generation.oracles import oracle_of
    from gqa_decode_fuzz.generation.prefill_cases import PrefillInputs
    from gqa_decode_fuzz.reference.compare import check_against_reference, raise_if_any

    inputs = PrefillInputs(*args, **{k: v for k, v in kwargs.items() if k in PrefillInputs._fields})
    q_bounds = inputs.qo_indptr.tolist()
    print(f"-- call {number}: causal prefill, {len(q_bounds) - 1} sequence(s), queries {list(q_bounds)} (qo_indptr)")
    print(f"-- call {number}: result against the float64 prefill oracle, one row per query token")
    try:
        raise_if_any(check_against_reference(output, lse, oracle_of(inputs)), f"call {number}")
    except AssertionError as error:
        print("\n".join(f"   {line}" for line in str(error).splitlines()))
        return True
    print("   every row within the bound")
    return False


def _replay_calls(calls: list[dict], options, impl, device, payload: dict, case) -> list[bool | None]:
    results = []
    for number, call in enumerate(calls):
        png = None
        if not options.no_png:
            base = options.png or options.file.with_suffix("")
            png = base.with_name(f"{base.stem}-call{number}.png") if len(calls) > 1 else base.with_suffix(".png")
        results.append(_replay_call(number, call, impl, device, png, f"{payload['nodeid']} call {number}", case))
    return results


def main(argv: list[str] | None = None) -> int:
    """Replay a case file; see the module docstring for the exit status."""
    options = _parser().parse_args(argv)
    # The suite is imported once the arguments are read (--help and a bad argument answer without torch), and the
    # device is resolved before any Triton kernel is imported.
    from gqa_decode_fuzz.engine.isolated_impl import load_target_for
    from gqa_decode_fuzz.engine.isolation import isolated
    from gqa_decode_fuzz.engine.target import DEFAULT_IMPL, DeviceError, ImplSpecError, resolve_device
    from gqa_decode_fuzz.generation.cases import definitions
    from gqa_decode_fuzz.record.casefiles import CaseFileError, definition_of, load_case

    try:
        device = resolve_device(options.device)  # before any Triton kernel is imported
        payload = load_case(options.file)
        definition = definition_of(payload)
        solution = payload.get("solution")
        # A Solution file is rebuilt from the path the run recorded (its own spec may be relative to that run).
        impl_spec = options.impl or (solution["path"] if solution else payload["impl"])
        in_child = isolated(options.isolation, impl_spec, DEFAULT_IMPL)
        target = load_target_for(impl_spec, Path.cwd(), device.type, isolated=in_child)
    except (CaseFileError, DeviceError, ImplSpecError, definitions.DefinitionError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return _replay(options, payload, target, definition, device, impl_spec, solution, in_child)
    finally:
        if in_child:
            target.function.close()  # its child process


def _replay(options, payload: dict, target, definition, device, impl_spec: str, solution: dict | None,
            in_child: bool) -> int:
    """Replay the recorded calls through ``target``; the exit status of ``main``."""
    from gqa_decode_fuzz.engine.containment import is_sticky_cuda_error
    from gqa_decode_fuzz.engine.target import ImplSpecError
    from gqa_decode_fuzz.generation.cases import using_definition
    from gqa_decode_fuzz.record.casefiles import case_from_fields

    try:
        impl = target.serving(definition)  # a destination-passing one through the suite's adapter, as in the run
    except ImplSpecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    case = case_from_fields(payload.get("case_fields"))
    for line in _header(payload, device, impl_spec) + _solution_lines(solution, target):
        print(line)
    print("isolation: " + ("on, the implementation runs in a child process" if in_child else "off, in this process"))
    calls = payload["calls"]
    if not calls:
        print("\nno inputs were recorded for this failure; rerun the test: pytest "
              f"'{payload['nodeid']}' --hypothesis-profile=repro")
        return 3
    try:
        with using_definition(definition):  # built arguments rebuild under the definition they were found with
            results = _replay_calls(calls, options, impl, device, payload, case)
    except RuntimeError as error:
        # A fault surfaces at the next synchronisation (the oracle, a read-back, the next call's build), outside
        # the implementation's call; the context is lost then, and the case has faulted again.
        if not is_sticky_cuda_error(error):
            raise
        print(f"\nreproduced on {device}: a sticky CUDA error, {str(error).strip().splitlines()[0]}")
        return 1
    rerun = f"rerun pytest '{payload['nodeid']}' --hypothesis-profile=repro"
    if any(results):
        print(f"\nreproduced on {device}.")
        return 1
    if None in results:
        print(f"\nnot replayed in full on {device}: {results.count(None)} of {len(results)} calls could not be "
              f"rebuilt from the file (see above); {rerun}.")
        return 3
    print(f"\ndid not reproduce on {device}: every recorded call is within the bound. The failure may need the "
          f"device it was found on, or concern a relation between calls: {rerun}.")
    return 0


