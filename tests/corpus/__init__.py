"""The mutant corpus: small deliberate defects of ``kernel/`` that the property suite must kill.

``MUTANTS`` lists the entries (``mutants.py``); ``materialise`` writes one as files
that ``--impl`` loads; ``run_suite`` runs the property suite against one in a
subprocess, with ``plugin`` loaded, and reads the outcome. tests/test_mutants.py
requires every entry to be killed; benchmarks/mutant_report.py prints the table in
docs/mutants.md.
"""

from .materialise import MutantPatchError, materialise
from .mutants import CLASSES, MUTANTS, Mutant, Patch, by_name
from .suite import SuiteRun, run_suite, suite_command

__all__ = [
    "CLASSES", "MUTANTS", "Mutant", "MutantPatchError", "Patch", "SuiteRun", "by_name", "materialise", "run_suite",
    "suite_command",
]
