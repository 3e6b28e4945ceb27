"""The pytest command of one corpus mutant's ``-x`` run without shrinking (``tests.corpus.suite.suite_command``),
materialised under WORKDIR, printed as one line for a shell script to run (gpu_session.sh, first_example_profile.sh):

    PYTHONPATH=. python benchmarks/mutant_command.py NAME WORKDIR [RECORD.json]

RECORD: where the run writes its corpus record (``--corpus-record``). The device is CUDA.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.corpus import by_name
from tests.corpus.materialise import materialise
from tests.corpus.suite import suite_command


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    mutant, workdir = by_name(argv[0]), Path(argv[1])
    workdir.mkdir(parents=True, exist_ok=True)
    record = Path(argv[2]) if len(argv) == 3 else None
    print(" ".join(suite_command(mutant, materialise(mutant, workdir), workdir, device="cuda", shrink=False,
                                 record=record)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
