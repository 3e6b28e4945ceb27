#!/usr/bin/env bash
# The two public AccelOpt Solution files for this family through --impl=FILE on a GPU, and each failure's replay.
# The suite does not redistribute them (the AccelOpt repository states no license) and this script fetches
# nothing: copy them from github.com/zhang677/AccelOpt, samples/fib/, into a folder and name it:
#   gqa_paged_decode_h32_kv4_d128_ps1_179eaadd8f774d70a52e6932d7f5f0f8.json
#   gqa_paged_decode_h32_kv8_d128_ps1_0cb2d36f3f91486f95befba29bfa03bf.json
# Usage: bash benchmarks/accelopt_solutions.sh DIR [pytest arguments...]   (summaries in $OUT, default ./accelopt-out)
set -uo pipefail
DIR=${1:?usage: bash benchmarks/accelopt_solutions.sh DIR [pytest arguments...]}
shift
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
    python3 -m properties.repro "$case_file" --no-png 2>&1 | head -n 40 >>"$OUT/summary.txt"
  done
done
