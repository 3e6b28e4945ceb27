#!/usr/bin/env bash
# Where a -x run's first example goes: one single-defect mutant (MUTANT, default lse_natural_log) run three
# times with one Triton cache (cold, warm, warm under cProfile); the run report's first-example stage rows of
# each, and the profile's heaviest calls. Summary to $OUT/first-example.txt. Measures only.
set -uo pipefail
. benchmarks/namespace.sh  # the checkout as gqa_decode_fuzz, as gpu_session.sh does
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TRITON_CACHE_DIR=/tmp/first-example-triton
mutant=${MUTANT:-lse_natural_log}
summary=$OUT/first-example.txt
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}; python writes bytecode: $(python3 -c 'import sys; print(not sys.dont_write_bytecode)')" >"$summary"
command=$(python3 benchmarks/mutant_command.py "$mutant" /tmp/first-example /tmp/first-example/record.json)
for run in cold warm profiled; do
  reports=/tmp/first-example-reports-$run
  rm -rf "$reports"
  words=($command --run-report="$reports")
  if [ "$run" = profiled ]; then words=("${words[0]}" -m cProfile -o /tmp/first-example.prof "${words[@]:1}"); fi
  start=$SECONDS
  timeout 150 "${words[@]}" >/tmp/first-example-$run.log 2>&1
  echo "== $mutant $run: exit $? in $((SECONDS - start)) s" >>"$summary"
  python3 benchmarks/example_anatomy.py "$mutant $run" /tmp/first-example/record.json "$TRITON_CACHE_DIR" >>"$summary"
  python3 - "$reports" >>"$summary" <<'PY'
import json, sys
from pathlib import Path
def find(node):
    if isinstance(node, dict):
        if "stages_ms_per_example" in node:
            return node["stages_ms_per_example"]
        return next((f for f in map(find, node.values()) if f), None)
    return None
for path in Path(sys.argv[1]).rglob("report.json"):
    stages = find(json.loads(path.read_text())) or {}
    print("  first-example stages:", json.dumps(stages.get("first"))[:1500])
PY
done
python3 - >>"$summary" <<'PY'
import pstats, io
stream = io.StringIO()
stats = pstats.Stats("/tmp/first-example.prof", stream=stream)
stats.sort_stats("cumulative").print_stats("gqa_decode_fuzz|site-packages/(torch|triton)/", 60)
stats.sort_stats("tottime").print_stats(25)
print("\n".join(line[:200] for line in stream.getvalue().splitlines()))
PY
tail -n 30 /tmp/first-example-warm.log | cut -c1-200 >>"$summary"
