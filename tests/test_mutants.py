"""The mutant corpus: the property suite (ci profile) must kill every deliberate defect of the kernel.

Each mutant is one item, so ``-n auto`` spreads them; each runs the whole property
suite in a subprocess through ``--impl`` (tests/corpus/suite.py), stopping at the
first failure. Shrinking is skipped here, which makes the check several times faster
without changing which mutants die; benchmarks/mutant_report.py runs the ci profile
with shrinking and reports the minimal counterexamples (docs/mutants.md). GPU-only
entries carry the ``gpu`` marker.
"""

from __future__ import annotations

import pytest
import torch

from gqa_decode_fuzz.engine.target import load_impl
from gqa_decode_fuzz.generation.cases import DecodeCase, build
from gqa_decode_fuzz.reference.definitions import ALL_BUILT_IN
from tests.corpus import CLASSES, MUTANTS, MutantPatchError, Patch, by_name, run_suite, suite_command
from tests.corpus.materialise import KERNEL_DIR, apply_patches, materialise_package


def _entry(mutant):
    return pytest.param(mutant, id=mutant.name, marks=[pytest.mark.gpu] if mutant.gpu_only else [])


@pytest.mark.parametrize("mutant", [_entry(m) for m in MUTANTS])
def test_property_suite_kills_mutant(mutant, tmp_path, device):
    run = run_suite(mutant, tmp_path, device=device.type, shrink=False)
    assert run.killed, (
        f"mutant {mutant.name} ({mutant.defect_class}: {mutant.rationale}) {run.verdict} after {run.seconds:.0f} s; "
        f"pytest output tail:\n{run.output[-4000:]}"
    )


@pytest.mark.parametrize("mutant", [pytest.param(m, id=m.name) for m in MUTANTS if m.patches])
def test_mutant_patches_apply_to_the_current_kernel(mutant):
    sources = {path.name: path.read_text() for path in KERNEL_DIR.glob("*.py")}
    patched = apply_patches(mutant.name, sources, mutant.patches)
    assert patched != sources


def test_patch_that_no_longer_matches_names_the_mutant():
    with pytest.raises(MutantPatchError, match="mutant 'gone'.*found it 0 times"):
        apply_patches("gone", {"_kernel.py": "x = 1\n"}, (Patch("_kernel.py", "y = 2", "y = 3"),))


def test_corpus_covers_every_defect_class():
    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names), "mutant names must be unique"
    assert len([m for m in MUTANTS if m.patches]) >= 20
    missing = set(CLASSES) - {m.defect_class for m in MUTANTS}
    assert not missing, f"no mutant for {sorted(missing)}"


def test_each_mutant_runs_under_a_built_in_definition_named_on_the_command_line(tmp_path):
    unknown = {m.name: m.definition for m in MUTANTS if m.definition is not None and m.definition not in ALL_BUILT_IN}
    assert not unknown, f"mutants under definitions that are not built in: {unknown}"
    paged = by_name("last_page_read_whole")
    assert f"--definition={paged.definition}" in suite_command(paged, "impl.py:run", tmp_path)
    assert not [a for a in suite_command(by_name("lse_natural_log"), "impl.py:run", tmp_path) if "--definition" in a]


@pytest.mark.parametrize("case", [DecodeCase(lengths=(3, 0, 130), values="wide", seed=1),
                                  DecodeCase(lengths=(1,), page_layout="contiguous", spare_pages=5, seed=2)])
def test_unpatched_copy_is_bitwise_the_kernel(tmp_path, device, case):
    """Materialising itself changes nothing: every kill comes from the patch."""
    from gqa_decode_fuzz.kernel import run

    copy = load_impl(f"{materialise_package('identity', (), tmp_path)}:run")
    inputs = build(case, device)
    for ours, theirs in zip(copy(*inputs.arguments()), run(*inputs.arguments())):
        assert torch.equal(ours, theirs)  # these cases hold no NaN

