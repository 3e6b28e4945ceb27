#!/usr/bin/env bash
# The two public AccelOpt Solution files for this family through --impl=FILE on a GPU, and each failure's replay.
# Copies of them (Apache-2.0, unchanged) are in tests/solutions/ (its README says where they come from); this
# script fetches nothing. Any folder of gqa_paged_decode_*.json Solution files works the same way.
# Usage: bash benchmarks/accelopt_solutions.sh [DIR [pytest arguments...]]   (summaries in $OUT, default ./accelopt-out)
set -uo pipefail
DIR=${1:-tests/solutions}
shift || true
OUT=${OUT:-accelopt-out}
mkdir -p "$OUT"
for solution in "$DIR"/gqa_paged_decode_*.json; do
  name=$(basename "$solution" .json)
  failures="$OUT/$name-failures"
  timeout -s INT -k 30 540 python3 -m pytest -p no:cacheprovider properties -n auto --impl="$solution" \
    --failures-dir="$failures" --run-report="$OUT/$name-report" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name: exit $?" | tee -a "$OUT/summary.txt"
  grep -E "^(FAILED|ERROR)|passed|failed|gqa-decode: the implementation declares" "$OUT/$name.log" \
    | cut -c1-300 | tee -a "$OUT/summary.txt"
  for case_file in "$failures"/*.pt; do
    [ -e "$case_file" ] || continue
    echo "-- replay $case_file" >>"$OUT/summary.txt"
    python3 -m gqa_decode_fuzz.record.repro "$case_file" --no-png 2>&1 | head -n 40 >>"$OUT/summary.txt"
  done
done
