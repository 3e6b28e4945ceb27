#!/usr/bin/env bash
# The GPU checks behind docs/gpu.md and docs/findings.md, in batches that fit a 10-minute command:
#   bash benchmarks/gpu_session.sh suite     # builder bits CPU==CUDA, our kernel (strict), SGLang, stage times
#   bash benchmarks/gpu_session.sh panel     # the correct panel, >= 10,000 examples each (correct tier)
#   bash benchmarks/gpu_session.sh faults    # the verbatim seed on every worker, a faulting kernel under -n0
#   bash benchmarks/gpu_session.sh profile   # cProfile of the heaviest properties, one process each
#   bash benchmarks/gpu_session.sh family    # our kernel (strict) on every built-in definition and a definition
#                                            # file, at the gpu profile; the plain -n auto on the seed's, with
#                                            # BEFORE=dir the same for an older checkout in the same call
#   bash benchmarks/gpu_session.sh adapters  # FlashInfer's decode wrapper (compile, smoke, the family) and PyTorch's
#                                            # four attention backends across the family; the carry
#                                            # .carry/flashinfer (adapters/flashinfer_package.py) on PYTHONPATH
#   bash benchmarks/gpu_session.sh verdicts  # isolation (hostile panel, a faulting kernel, the sanitizer, the seed's
#                                            # huge-pool fault), root causes (a one-defect kernel, peak memory of a
#                                            # huge-pool shrink), the AccelOpt Solution files
#   bash benchmarks/gpu_session.sh prefill-adapters # FlashInfer's prefill wrappers (compile, smoke) and torch SDPA's
#                                            # causal lower-right prefill (flash, efficient, cudnn), each on one paged
#                                            # ps1, one paged ps64 and one ragged definition; under 9 minutes in all;
#                                            # PREFILL_ENTRIES="..." names other entries (the *_as_served ones)
#   bash benchmarks/gpu_session.sh isolation # the sanitizer on the planted one-past reader, a faulting kernel under the
#                                            # run's own MPS server (children outside it), tests/test_isolation.py,
#                                            # with THROUGHPUT=1 examples/s with isolation off and on
#   bash benchmarks/gpu_session.sh causes    # the sanitizer on the one-past reader's explicit example, root causes of a
#                                            # one-defect kernel and of the verbatim seed over the whole suite,
#                                            # tests/test_isolation.py
#   bash benchmarks/gpu_session.sh reach     # one sanitized call told whole, the sanitizer on the one-past reader,
#                                            # tests/test_isolation.py, examples/s with isolation off and on; with
#                                            # FAMILY=1 also SGLang across the family (the carry .carry/sglang from
#                                            # adapters/sglang_package.py) and cuDNN's root causes
#   bash benchmarks/gpu_session.sh sanitizer # compute-sanitizer on one call without the suite, one sanitized call
#                                            # told whole, tests/test_isolation.py's hang test
#   bash benchmarks/gpu_session.sh round     # this round's figures: the plain command cold and warm, stages over 2,000
#                                            # examples, an isolated torch --impl, `check` on a defect and a correct one
#   bash benchmarks/gpu_session.sh prefill   # causal prefill: the issue's three plain commands (paged ps1, ps64, ragged)
#                                            # and the prefill mutants on CUDA
#   bash benchmarks/gpu_session.sh prefill-family # every prefill definition at the gpu profile (a time budget)
#   bash benchmarks/gpu_session.sh speed     # builder bits CPU==CUDA, stage times, the plain -n auto
#                                            # (cold, warm); BEFORE=dir adds an older checkout (BEFORE_STAGES_ONLY=1:
#                                            # its stages only), SWEEP=4,8,16 workers, MPS=1 the plain run under MPS
#   bash benchmarks/gpu_session.sh finish    # issue 25's last verdicts: compute-sanitizer's version and options,
#                                            # tests/test_isolation.py -n 20, the sanitizer on the one-past reader's
#                                            # explicit example and on a property it must shrink (case file, report)
#   bash benchmarks/gpu_session.sh first-failure # time to first failure: the seed design's single-defect mutants,
#                                            # one at a time without shrinking, and `check --first-failure` on one;
#                                            # BEFORE=dir the mutants for an older checkout instead
#   bash benchmarks/gpu_session.sh timeline  # the phases of a -x run of two single-defect mutants (cold, then warm
#                                            # caches) and of `check --first-failure` (benchmarks/startup_probe.py);
#                                            # BEFORE=dir the mutants for an older checkout too
#   bash benchmarks/gpu_session.sh anatomy   # where a -x run's time to first failure goes: single-defect mutants, each
#                                            # with a fresh Triton cache and again warm; each example's ms and the gap
#                                            # before it (tests/corpus/plugin.py), the kernels Triton compiled
#                                            # (benchmarks/example_anatomy.py); MUTANTS="..." names others
#   bash benchmarks/gpu_session.sh production # ENTRIES="NAME=IMPL ..." each across the family (DEFINITION, default
#                                            # all) at EXAMPLES per property (default 40) for BUDGET s (--time-budget,
#                                            # default 120), root causes included; FlashInfer compiled first when
#                                            # named; a digest of each report (benchmarks/report_digest.py);
#                                            # PROBE_LIMIT s (default 150) after the budget for the tests in flight
#                                            # (a failing one shrinks), the cause probes (within the budget, or 30 s
#                                            # past it) and the report: a step cut before the probes end leaves its
#                                            # report without causes;
#                                            # SANITIZER_SHRINK=SECONDS: a sanitized failure shrinks beside them;
#                                            # PYTEST_ARGS: more options for each entry's run (-k EXPR, a file)
#   bash benchmarks/gpu_session.sh sweep     # the production sweep's way (docs/findings.md): ENTRIES="NAME=IMPL ..."
#                                            # each through `production` over every decode definition at the gpu
#                                            # profile (EXAMPLES, default 300) with --mps=${MPS:-all}, BUDGET s each;
#                                            # the GPU's memory sampled every second, its peak per entry in the summary;
#                                            # on a GPU under 100 GB, SMALL_GPU_WORKERS (8) workers unless
#                                            # PYTEST_ARGS names --workers-per-gpu; each failure shrinks for at
#                                            # most SHRINK_LIMIT s (30) unless PYTEST_ARGS names --shrink-limit
#   bash benchmarks/gpu_session.sh seven     # the seven production entries through `sweep`, resumable: each call runs the
#                                            # entries not yet done on this (warm) machine that fit in LIMIT s (560)
#                                            # and names the rest; three or four calls in a row on one GPU
#   bash benchmarks/gpu_session.sh limits    # what stops the plain run: at the goal's 1,500 examples per property with
#                                            # 8 and 16 workers and at the profile's 300 with 8 (warm caches; RUNS=
#                                            # "1500x8 300x8" names others), the GPU's utilisation sampled every 200 ms
#                                            # (gpu_busy.txt: percentiles per run; ORACLE_GROUPS=1 first times the
#                                            # oracle's grouping by length, oracle_groups.py); then the device's busy time per
#                                            # example (throughput.py launches; NO_LAUNCHES=1 leaves it out); each
#                                            # failure's case and error in case_files.txt
#   bash benchmarks/gpu_session.sh start     # the plain command's start with --warm-workers=kept (throughput.py startup):
#                                            # this tree's, with its gateways one after another too
#                                            # (benchmarks/sequential_gateways.py), and BEFORE=dir's (an older checkout);
#                                            # then the plain command with on and kept, and BEFORE's with kept
#   bash benchmarks/gpu_session.sh oracle    # the oracle's, bound's and comparison's tests on CUDA, then the busy time per
#                                            # example (launches), the stage table and the plain run at RUNS (default
#                                            # "1500x8"), for BEFORE=dir (an older checkout; its runs BEFORE_RUNS,
#                                            # default RUNS) first, then this one
#   bash benchmarks/gpu_session.sh busy      # the device's busy time per example and stage (throughput.py launches), the
#                                            # plain run's report (per-property time), and 16 workers on one GPU with
#                                            # pytest's own failure lines (WORKERS=16)
# Summaries go to $OUT (default ./gpu-out); each step has its own time limit, so one slow step cannot
# take the rest down. SGLang's kernel file is found on PYTHONPATH (adapters/sglang_decode.py says how).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTEST=(python3 -m pytest -p no:cacheprovider)

. "$(dirname "$0")/namespace.sh"  # gqa_decode_fuzz importable without installing the checkout

step() {  # step NAME SECONDS COMMAND...: run, keep the last lines, record the exit status and wall time
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout -s INT -k 30 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local status=$?
  echo "== $name: exit $status in $((SECONDS - start)) s: $*" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log" | cut -c1-300 >>"$OUT/summary.txt"
}

case_file_errors() {  # case_file_errors FILE...: each case file's case and error, in its own words, to case_files.txt
  for case_file in "$@"; do
    [ -e "$case_file" ] || continue  # an unmatched glob
    python3 -c 'import sys; from gqa_decode_fuzz.record import casefiles
p = casefiles.load_case(sys.argv[1]); print("--", sys.argv[1], "| case:", p.get("case_repr")); print(p.get("error", ""))' \
      "$case_file" 2>&1 | head -c 4000 >>"$OUT/case_files.txt"
  done
}

watch_resources() {  # peak host RAM in use and failures/ size, every 2 s, until killed
  local peak=0 used
  while sleep 2; do
    used=$(free -m | awk '/^Mem:/ {print $3}')
    [ "$used" -gt "$peak" ] && peak=$used
    echo "peak_ram_mb=$peak failures=$(du -sm failures 2>/dev/null | cut -f1)MB" >"$OUT/resources.txt"
  done
}

case "${1:-suite}" in
suite)
  nvidia-smi -L | tee "$OUT/summary.txt"
  python3 -c 'import torch, triton, hypothesis; print("torch", torch.__version__, "triton", triton.__version__,
              "hypothesis", hypothesis.__version__)' | tee -a "$OUT/summary.txt"
  step builder_bits 150 "${PYTEST[@]}" tests/test_builder.py -m gpu -n 0 -q --run-report=none
  step ours_strict 240 "${PYTEST[@]}" properties -n auto --workers-per-gpu=8 --hypothesis-profile=gpu
  step sglang_as_served 300 "${PYTEST[@]}" properties -n auto --workers-per-gpu=8 --hypothesis-profile=gpu \
    --impl=adapters/sglang_decode.py:run_as_served
  step sglang_whole_contract 120 "${PYTEST[@]}" properties/test_decode.py properties/test_edge_shapes.py \
    -n auto --workers-per-gpu=4 --hypothesis-profile=gpu --impl=adapters/sglang_decode.py:run
  ;;
round)
  # This round's figures: the plain command cold and warm, the stage table over thousands of examples, an isolated
  # fast --impl, and `gqa-decode-fuzz check` on a correct and a single-defect kernel (seconds to the verdict).
  nvidia-smi -L | tee "$OUT/summary.txt"
  step plain_auto 200 python3 benchmarks/throughput.py scaling --gpus 1 --repeat 2 --no-warmup --out "$OUT/runs"
  latest=$(ls -t "$OUT"/runs/scaling/gpus1-*/*/report.md 2>/dev/null | head -n 1)
  [ -n "$latest" ] && cp "$latest" "$OUT/plain_report.md"
  step stages 120 python3 benchmarks/throughput.py stages --device cuda --examples 2000
  step isolated_torch 150 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --run-report="$OUT/runs/iso" \
    --impl=tests/impls/torch_float32.py:run -q
  latest=$(ls -t "$OUT"/runs/iso/*/report.md 2>/dev/null | head -n 1)
  [ -n "$latest" ] && cp "$latest" "$OUT/isolated_report.md"
  step check_defect 200 python3 -m gqa_decode_fuzz.cli check tests/impls/wrong_kv_head.py:run --out /tmp/checks \
    --json "$OUT/check_defect.json"
  step check_correct 200 python3 -m gqa_decode_fuzz.cli check tests/impls/torch_float32.py:run --out /tmp/checks \
    --json "$OUT/check_correct.json"
  rm -rf "$OUT/runs"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
prefill)
  # Causal prefill on the project's kernel: the plain command for one paged ps1, one paged ps64 and one ragged
  # definition, then the prefill mutants (each must be killed).
  nvidia-smi -L | tee "$OUT/summary.txt"
  for definition in gqa_paged_prefill_causal_h32_kv4_d128_ps1 gqa_paged_prefill_causal_h32_kv4_d128_ps64 \
                    gqa_ragged_prefill_causal_h32_kv4_d128; do
    step "plain_$definition" 110 "${PYTEST[@]}" properties -n auto --definition="$definition" \
      --run-report="$OUT/runs/$definition"
    latest=$(ls -t "$OUT/runs/$definition"/*/report.md 2>/dev/null | head -n 1)
    [ -n "$latest" ] && cp "$latest" "$OUT/report_$definition.md"
  done
  mutants=$(python3 benchmarks/mutant_report.py --list | awk -F'|' '$2 ~ /prefill_/ {gsub(/ /, "", $2); print $2}')
  # shellcheck disable=SC2086  # one argument per mutant name
  step prefill_mutants 200 python3 benchmarks/mutant_report.py --device=cuda --jobs=4 $mutants
  rm -rf "$OUT/runs"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
prefill-family)
  nvidia-smi -L | tee "$OUT/summary.txt"
  step prefill_family 400 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --definition=prefill \
    --time-budget=330 --run-report="$OUT/runs/family"
  latest=$(ls -t "$OUT"/runs/family/*/report.md 2>/dev/null | head -n 1)
  [ -n "$latest" ] && cp "$latest" "$OUT/report_prefill_family.md"
  rm -rf "$OUT/runs"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
speed)
  nvidia-smi -L | tee "$OUT/summary.txt"
  nproc | sed 's/^/cores: /' | tee -a "$OUT/summary.txt"
  # Every builder test: the fused CUDA draws and the whole builder against the CPU's bits.
  step builder_bits 120 "${PYTEST[@]}" tests/test_builder.py -n 0 -q --run-report=none
  step stages 100 python3 benchmarks/throughput.py stages --device cuda --examples 300
  # The plain command twice: the first run starts with cold Triton caches, the second with warm ones.
  step plain_auto 220 python3 benchmarks/throughput.py scaling --gpus 1 --repeat 2 --no-warmup --out "$OUT/runs"
  latest=$(ls -t "$OUT"/runs/scaling/gpus1-*/*/report.md 2>/dev/null | head -n 1)
  [ -n "$latest" ] && cp "$latest" "$OUT/plain_report.md"  # per-property examples and examples/s
  if [ -n "${BEFORE:-}" ]; then  # an older checkout of the suite (git archive into BEFORE), for the before/after table
    step before_stages 100 bash -c "cd '$BEFORE' && python3 benchmarks/throughput.py stages --device cuda --examples 300"
    [ -z "${BEFORE_STAGES_ONLY:-}" ] && step before_plain_auto 150 bash -c \
      "cd '$BEFORE' && python3 benchmarks/throughput.py scaling --gpus 1 --no-warmup"
  fi
  if [ -n "${MPS:-}" ] && command -v nvidia-cuda-mps-control >/dev/null; then
    # The same plain command with the workers' CUDA contexts served by one MPS server (kernels of different
    # processes run side by side instead of time-sliced); the daemon is stopped again at the end.
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/gqa-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/gqa-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && echo "MPS daemon started" | tee -a "$OUT/summary.txt"
    step plain_auto_mps 220 python3 benchmarks/throughput.py scaling --gpus 1 --repeat 2 --no-warmup \
      --workers-per-gpu "${MPS_WORKERS:-auto}"
    echo quit | nvidia-cuda-mps-control
    sleep 2
  fi
  if [ -n "${SWEEP:-}" ]; then
    step workers_per_gpu 200 python3 benchmarks/throughput.py scaling --gpus 1 --workers-per-gpu "$SWEEP" \
      --max-examples 100 --no-warmup
  fi
  rm -rf "$OUT/runs"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log  # few files come back
  ;;
family)
  nvidia-smi -L | tee "$OUT/summary.txt"
  python3 -c 'import torch, triton, hypothesis; print("torch", torch.__version__, "triton", triton.__version__,
              "hypothesis", hypothesis.__version__)' | tee -a "$OUT/summary.txt"
  step kernel_family "${FAMILY_LIMIT:-270}" "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu \
    --definition=all --run-report=reports-family
  report=$(ls -t reports-family/*/report.md 2>/dev/null | head -n 1)
  [ -n "$report" ] && cp "$report" "$OUT/family_report.md"
  step definition_file 70 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --run-report=none \
    --definition=tests/definitions/gqa_paged_decode_h16_kv2_d128_ps16.json
  step plain_after 110 python3 benchmarks/throughput.py scaling --gpus 1 --repeat 2
  if [ -n "${BEFORE:-}" ]; then
    step plain_before 110 bash -c "cd '$BEFORE' && python3 benchmarks/throughput.py scaling --gpus 1 --repeat 2"
  fi
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
adapters)
  nvidia-smi -L | tee "$OUT/summary.txt"
  export PYTHONPATH=$PWD/.carry/flashinfer${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fi \
    FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_NVCC_THREADS=4 MAX_JOBS=16
  step flashinfer_smoke "${SMOKE_LIMIT:-200}" python3 -m adapters.flashinfer_decode
  for entry in ${FLASHINFER_ENTRIES:-run}; do
    step "flashinfer_$entry" "${FAMILY_LIMIT:-110}" "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu \
      --definition=all --max-examples="${EXAMPLES:-100}" --run-report="reports-flashinfer-$entry" \
      "--impl=adapters/flashinfer_decode.py:$entry"
  done
  for entry in ${TORCH_ENTRIES:-flash efficient cudnn math}; do
    step "torch_$entry" "${TORCH_LIMIT:-55}" "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu \
      --definition=all --max-examples="${TORCH_EXAMPLES:-30}" --run-report="reports-torch-$entry" \
      "--impl=adapters/torch_sdpa.py:$entry"
  done
  for report in reports-*/*/report.md; do  # the verdict lines and failing rows of each run
    { echo "#### $report"; grep -m1 '^\*\*' "$report"; grep -E '\| (FAILED|CRASHED|error) \|' "$report" | cut -c1-400
      sed -n '/distinct failure/,/^## /p' "$report" | head -n 60; } >>"$OUT/adapter_verdicts.md"
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  tar czf "$OUT/failures.tgz" failures 2>/dev/null || true
  ;;
prefill-adapters)  # each run: --time-budget seconds, then root causes, within its timeout; summaries to $OUT
  nvidia-smi -L | tee "$OUT/summary.txt"
  export PYTHONPATH=$PWD/.carry/flashinfer${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fi \
    FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_NVCC_THREADS=4 MAX_JOBS=16
  paged=gqa_paged_prefill_causal_h32_kv4_d128_ps1,gqa_paged_prefill_causal_h32_kv8_d128_ps64
  prefill=${PREFILL_DEFINITIONS:-$paged,gqa_ragged_prefill_causal_h32_kv4_d128}  # paged ps1, paged ps64, ragged
  rm -rf reports-prefill-* failures-prefill-*
  step flashinfer_prefill_smoke "${SMOKE_LIMIT:-150}" python3 -m adapters.flashinfer_prefill
  PYTHONPATH=$PWD:$PYTHONPATH step flashinfer_prefill_lse_models 60 python3 benchmarks/flashinfer_prefill_lse_models.py
  for impl in ${PREFILL_ENTRIES:-adapters/flashinfer_prefill.py:run adapters/torch_sdpa_prefill.py:flash \
      adapters/torch_sdpa_prefill.py:efficient adapters/torch_sdpa_prefill.py:cudnn}; do
    name=prefill-$(basename "${impl%%.py:*}")-${impl##*:}
    step "$name" $((${BUDGET:-35} + ${PROBE_LIMIT:-30})) "${PYTEST[@]}" properties -n 8 --hypothesis-profile=gpu \
      "--definition=$prefill" "--max-examples=${EXAMPLES:-100}" "--time-budget=${BUDGET:-35}" "--impl=$impl" \
      "--run-report=reports-$name" "--failures-dir=failures-$name"
    for report in "reports-$name"/*/report.md; do  # the verdict and the head of the verdict table
      [ -e "$report" ] && { echo "#### $name: $report"; head -n 40 "$report" | cut -c1-400
        sed -n '/distinct failure/,/^## /p' "$report" | head -n 40
        sed -n '/^| property | verdict/,/^$/p' "$report" | cut -c1-300; } >>"$OUT/prefill_verdicts.md"
    done
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  tar czf "$OUT/failures.tgz" failures-prefill-* 2>/dev/null || true
  ;;
isolation)
  nvidia-smi -L | tee "$OUT/summary.txt"
  rm -rf failures reports
  step dead_load 40 python3 benchmarks/dead_load_probe.py
  step sanitizer_catches 80 "${PYTEST[@]}" properties/test_decode.py -n 0 -q --run-report=none \
    --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 --max-examples=5
  grep -m 3 -E "Invalid __global__|bytes after|SanitizerError" "$OUT/sanitizer_catches.log" >>"$OUT/summary.txt"
  step sanitizer_off 30 "${PYTEST[@]}" properties/test_decode.py -n 0 -q --run-report=none \
    --impl=tests/impls/reads_one_past.py:run --max-examples=50
  step faulting_kernel_mps 120 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu -q \
    --impl=tests/impls/out_of_bounds_kernel.py:run --run-report=reports-faulting
  echo "worker restarts: $(grep -c -E 'node down|replacing crashed worker' "$OUT/faulting_kernel_mps.log")" \
    | tee -a "$OUT/summary.txt"
  grep -E "MPS|distinct failure" "$OUT/faulting_kernel_mps.log" | head -n 5 >>"$OUT/summary.txt"
  for report in reports-faulting/*/report.md; do
    { echo "#### $report"; head -n 80 "$report" | cut -c1-400; } >>"$OUT/verdicts.md"
  done
  for case_file in $(ls failures/*.pt 2>/dev/null | head -n 2); do
    { echo "-- replay $case_file"; timeout 30 python3 -m gqa_decode_fuzz.record.repro "$case_file" --no-png 2>&1 | tail -n 15; } \
      >>"$OUT/replays.txt"
  done
  step test_isolation 180 "${PYTEST[@]}" tests/test_isolation.py -n 8 -q
  if [ -n "${THROUGHPUT:-}" ]; then
    step throughput_isolation 200 python3 benchmarks/throughput.py isolation --device cuda --workers auto \
      --isolation off,on --repeat 1 --max-examples 15
  fi
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
finish)
  nvidia-smi -L | tee "$OUT/summary.txt"
  rm -rf failures failures-* reports reports-*
  { compute-sanitizer --version | tail -n 2; compute-sanitizer --help | grep -A 6 -E "destroy-on-device-error"; } \
    >>"$OUT/summary.txt" 2>&1
  step test_isolation 230 "${PYTEST[@]}" tests/test_isolation.py -n 20 -q --durations=8
  step sanitizer_explicit 100 "${PYTEST[@]}" properties/test_edge_shapes.py -k single_token -n 0 -q \
    --run-report=none --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 \
    --max-examples=1 --failures-dir=failures-explicit
  step sanitizer_shrink 210 "${PYTEST[@]}" properties/test_edge_shapes.py -k block_edges -n 0 -q \
    --run-report=none --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 \
    --max-examples=10 --failures-dir=failures-shrink
  case_file_errors failures-explicit/*.pt failures-shrink/*.pt
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
first-failure)
  nvidia-smi -L | tee -a "$OUT/summary.txt"
  mutants=$(python3 benchmarks/mutant_report.py --list | awk -F'|' '$5 ~ /^ *seed *$/ && $6 ~ /CPU/ {gsub(/ /, "", $2); print $2}')
  if [ -n "${BEFORE:-}" ]; then  # its own namespace: the older checkout's folders, not this one's
    step before_first_failure 560 bash -c "cd '$BEFORE' && unset PYTHONPATH && . benchmarks/namespace.sh && \
      python3 benchmarks/mutant_report.py --device=cuda --jobs=1 --no-shrink $(echo $mutants)"
  else
    # shellcheck disable=SC2086  # one argument per mutant name
    step first_failure 420 python3 benchmarks/mutant_report.py --device=cuda --jobs=1 --no-shrink $mutants
    for run in 1 2 3; do
      step "check_first_failure_$run" 60 python3 -m gqa_decode_fuzz.cli check tests/impls/wrong_kv_head.py:run \
        --first-failure --out /tmp/checks --json "$OUT/check_first_failure_$run.json"
    done
  fi
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
timeline)
  nvidia-smi -L | tee -a "$OUT/summary.txt"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  probe_mutant() {  # probe_mutant TAG MUTANT: its suite command under the startup probe, the phases to summary.txt
    local log=$OUT/probe-$1.jsonl t0
    local command
    command=$(python3 benchmarks/mutant_command.py "$2" /tmp/timeline)
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086  # the command's words
    STARTUP_PROBE_LOG=$log STARTUP_PROBE_T0=$t0 step "timeline_$1" 120 ${command/-m pytest/-m pytest -p benchmarks.startup_probe}
    echo "phases of $1 (s from the start):" >>"$OUT/summary.txt"
    python3 benchmarks/startup_probe.py "$log" "$t0" >>"$OUT/summary.txt" 2>&1
  }
  for mutant in lse_natural_log accumulator_not_rescaled; do
    probe_mutant "$mutant-cold" "$mutant"
    probe_mutant "$mutant-warm" "$mutant"
  done
  log=$OUT/probe-check.jsonl t0=$(date +%s.%N)
  STARTUP_PROBE_LOG=$log STARTUP_PROBE_T0=$t0 step check_first_failure 90 python3 -m gqa_decode_fuzz.cli check \
    tests/impls/wrong_kv_head.py:run --first-failure --out /tmp/checks -- -p benchmarks.startup_probe
  echo "phases of check --first-failure (s from the start):" >>"$OUT/summary.txt"
  python3 benchmarks/startup_probe.py "$log" "$t0" >>"$OUT/summary.txt" 2>&1
  if [ -n "${BEFORE:-}" ]; then
    (cd "$BEFORE" && unset PYTHONPATH && . benchmarks/namespace.sh && export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} &&
      OUT=$OUT/before; mkdir -p "$OUT"; for mutant in lse_natural_log accumulator_not_rescaled; do
        probe_mutant "$mutant-warm" "$mutant"; done)
    cat "$OUT/before/summary.txt" >>"$OUT/summary.txt"
  fi
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
anatomy)
  nvidia-smi -L | tee -a "$OUT/summary.txt"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  for mutant in ${MUTANTS:-lse_natural_log accumulator_not_rescaled q_batch_stride_assumed empty_sequence_lse_zero \
                 tail_logits_not_masked scale_ignored}; do
    cache=/tmp/anatomy-triton-$mutant
    rm -rf "$cache"
    for run in cold warm; do
      command=$(python3 benchmarks/mutant_command.py "$mutant" /tmp/anatomy "/tmp/anatomy/$mutant-$run.json")
      # shellcheck disable=SC2086  # the command's words
      TRITON_CACHE_DIR=$cache step "anatomy_${mutant}_$run" 120 $command
      python3 benchmarks/example_anatomy.py "$mutant $run" "/tmp/anatomy/$mutant-$run.json" "$cache" \
        >>"$OUT/summary.txt" 2>&1
    done
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
limits)
  nvidia-smi -L | tee "$OUT/summary.txt"
  nproc | sed 's/^/cores: /' | tee -a "$OUT/summary.txt"
  step warm 150 python3 benchmarks/throughput.py scaling --gpus 1 --max-examples 4 --no-warmup
  [ -n "${ORACLE_GROUPS:-}" ] && step oracle_groups 200 python3 benchmarks/oracle_groups.py --cases 300
  for run in ${RUNS:-1500x8 1500x16 300x8}; do  # examples per property x workers
    set -- ${run/x/ }
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >"$OUT/util-$1-$2.raw" &
    sampler=$!
    step "plain_$1_$2" 300 python3 benchmarks/throughput.py scaling --gpus 1 --max-examples "$1" \
      --workers-per-gpu "$2" --no-warmup --out "$OUT/runs"
    kill $sampler
    case_file_errors "$OUT"/runs/scaling/failures/*.pt  # what each failure raised, then the case files go
    rm -rf "$OUT/runs"
    python3 benchmarks/gpu_busy.py "$OUT/util-$1-$2.raw" "$1 examples/property, $2 workers" >>"$OUT/gpu_busy.txt"
    rm -f "$OUT/util-$1-$2.raw"
  done
  [ -z "${NO_LAUNCHES:-}" ] && step launches 200 python3 benchmarks/throughput.py launches --examples 300
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
oracle)
  nvidia-smi -L | tee "$OUT/summary.txt"
  step oracle_tests 240 "${PYTEST[@]}" tests/test_bound.py tests/test_compare.py tests/test_fused_guard.py \
    tests/test_oracle.py tests/test_prefill_oracle.py \
    tests/test_graphs.py -p no:xdist -q --run-report=none
  measure() {  # measure TAG RUNS: launches, stages and the plain runs of the checkout in the working directory
    step "$1_launches" 200 python3 benchmarks/throughput.py launches --examples 300
    step "$1_stages" 200 python3 benchmarks/throughput.py stages --device cuda --examples 1000
    for run in $2; do
      set -- "$1" ${run/x/ }
      step "$1_plain_$2_$3" 300 python3 benchmarks/throughput.py scaling --gpus 1 --max-examples "$2" \
        --workers-per-gpu "$3" --no-warmup --out "/tmp/runs-$1"
      case_file_errors /tmp/runs-"$1"/scaling/failures/*.pt
      rm -rf "/tmp/runs-$1"
    done
  }
  if [ -n "${BEFORE:-}" ]; then  # its own namespace: the older checkout's folders, not this one's
    (cd "$BEFORE" && unset PYTHONPATH && . benchmarks/namespace.sh && measure before "${BEFORE_RUNS:-${RUNS:-1500x8}}")
  fi
  measure after "${RUNS:-1500x8}"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
busy)
  nvidia-smi -L | tee "$OUT/summary.txt"
  step launches 200 python3 benchmarks/throughput.py launches --examples 300
  step plain 120 python3 benchmarks/throughput.py scaling --gpus 1 --no-warmup --out "$OUT/runs"
  latest=$(ls -t "$OUT"/runs/scaling/gpus1-*/*/report.md 2>/dev/null | head -n 1)
  [ -n "$latest" ] && cp "$latest" "$OUT/plain_report.md"
  rm -rf "$OUT/runs"
  step "workers_${WORKERS:-16}" 200 "${PYTEST[@]}" properties -n auto --workers-per-gpu="${WORKERS:-16}" \
    --hypothesis-profile=gpu -q -rfE --run-report="$OUT/runs16"
  grep -E "^(FAILED|ERROR) |Error|error:" "$OUT/workers_${WORKERS:-16}.log" | sort | uniq -c | sort -rn | head -n 40 \
    | cut -c1-400 >"$OUT/workers_failures.txt"
  awk '/^_{5,} /{n++} n>=1 && n<=2' "$OUT/workers_${WORKERS:-16}.log" | head -n 150 | cut -c1-300 >>"$OUT/workers_failures.txt"
  rm -rf "$OUT/runs16"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
production)  # appends to $OUT's summary and digest, so several runs can share one $OUT (TAG names their logs)
  nvidia-smi -L | tee -a "$OUT/summary.txt"
  export PYTHONPATH=$PWD/.carry/flashinfer:$PWD/.carry/sglang${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fi \
    FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_NVCC_THREADS=4 MAX_JOBS=16
  if [ -n "${SANITIZER_SHRINK:-}" ]; then  # beside the entries (one process, one child): a sanitized failure shrunk
    step sanitizer_shrink "$SANITIZER_SHRINK" "${PYTEST[@]}" properties/test_edge_shapes.py -k block_edges -n 0 -q \
      --run-report=none --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 \
      --max-examples=10 --failures-dir=failures-shrink &
  fi
  case " ${ENTRIES:?name the entries} " in
  *flashinfer*) step flashinfer_compile "${SMOKE_LIMIT:-200}" python3 -m adapters.flashinfer_decode ;;
  esac
  for entry in $ENTRIES; do
    name=${entry%%=*}
    rm -rf "failures-$name" "reports-$name"
    step "$name" $((${BUDGET:-120} + ${PROBE_LIMIT:-150})) "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu \
      "--definition=${DEFINITION:-all}" "--max-examples=${EXAMPLES:-40}" "--time-budget=${BUDGET:-120}" \
      "--impl=${entry#*=}" "--run-report=reports-$name" "--failures-dir=failures-$name" ${PYTEST_ARGS:-}
    python3 benchmarks/report_digest.py "reports-$name"/*/ >>"$OUT/digest.md" 2>&1  # each at once: a cut call keeps it
  done
  wait
  case_file_errors failures-shrink/*.pt
  tar czf "$OUT/logs-${TAG:-production}.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
sweep)
  # Twelve workers and their children filled an 80 GB H100 over the family (docs/gpu.md section 45): fewer there.
  options=""
  total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  if [ "${total_mib:-0}" -lt 100000 ] && [[ "${PYTEST_ARGS:-}" != *workers-per-gpu* ]]; then
    options="--workers-per-gpu=${SMALL_GPU_WORKERS:-8}"
  fi
  # An entry that fails widely spent most of its items' time shrinking (docs/performance.md, "Shrinking").
  [[ "${PYTEST_ARGS:-}" == *shrink-limit* ]] || options="$options --shrink-limit=${SHRINK_LIMIT:-30}"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -l 1 >"$OUT/memory.csv" 2>&1 &
  sampler=$!
  for entry in ${ENTRIES:?name the entries}; do
    name=${entry%%=*}
    sampled=$(wc -l <"$OUT/memory.csv")
    DEFINITION=decode EXAMPLES=${EXAMPLES:-300} TAG=$name ENTRIES=$entry \
      PYTEST_ARGS="--mps=${MPS:-all} $options ${PYTEST_ARGS:-}" bash "$0" production
    tail -n +"$((sampled + 1))" "$OUT/memory.csv" | awk -F', ' -v name="$name" '$1 + 0 > peak {peak = $1 + 0; all = $2}
      END {print "peak GPU memory during " name ": " peak " of " all " MiB"}' >>"$OUT/summary.txt"
  done
  kill "$sampler"
  ;;
seven)
  # The production sweep's seven entries on one GPU, in calls of a 10-minute limit: each call runs, in the order
  # below, the entries not yet done on this machine (SWEEP_STATE, kept while it stays warm) whose worst case fits in
  # what is left of LIMIT s, and names those left for the next call. Budgets as the steps of docs/gpu.md §44-§49.
  state=${SWEEP_STATE:-/tmp/gqa-seven-sweep}
  mkdir -p "$state"
  while read -r name impl budget probes mps; do
    [ -e "$state/$name" ] && continue
    worst=$((budget + probes + 20))
    [[ $impl == *flashinfer* ]] && worst=$((worst + 80))  # its compile and smoke check
    if [ $((SECONDS + worst)) -gt "${LIMIT:-560}" ]; then
      echo "== $name: left for the next call (up to $worst s; $((${LIMIT:-560} - SECONDS)) s left)" >>"$OUT/summary.txt"
      continue
    fi
    start=$SECONDS digested=$(cat "$OUT/digest.md" 2>/dev/null | wc -l)
    ENTRIES="$name=$impl" BUDGET=$budget PROBE_LIMIT=$probes MPS=$mps bash "$0" sweep </dev/null
    # The budgets were set on fast hosts: on a slower one an entry ends with items unstarted, which its digest counts.
    unstarted=$(tail -n +"$((digested + 1))" "$OUT/digest.md" 2>/dev/null |
      grep -o "left unstarted by the time budget: [0-9]*" | tail -n 1)
    echo "== $name: swept in $((SECONDS - start)) s; properties ${unstarted:-left unstarted: unknown (no digest)}" \
      >>"$OUT/summary.txt"
    touch "$state/$name"
  done <<'ENTRIES'
fi_run adapters/flashinfer_decode.py:run_as_served 100 50 all
fi_default adapters/flashinfer_decode.py:default_as_served 100 50 all
flash adapters/torch_sdpa.py:flash_as_served 150 50 all
efficient adapters/torch_sdpa.py:efficient_as_served 140 30 all
math adapters/torch_sdpa.py:math 140 30 all
cudnn adapters/torch_sdpa.py:cudnn_as_served 260 40 all
sglang adapters/sglang_decode.py:run_as_served 400 60 auto
ENTRIES
  (cd "$OUT" && tar czf seven-logs.tgz logs-*.tgz memory.csv 2>/dev/null && rm -f logs-*.tgz memory.csv)
  ;;
start)
  nvidia-smi -L | tee -a "$OUT/summary.txt"
  STARTUP=(python3 benchmarks/throughput.py startup --device cuda --workers auto --repeat 4 -- --warm-workers=kept)
  if [ -n "${BEFORE:-}" ]; then  # its own namespace: the older checkout's folders, not this one's
    step start_before 100 bash -c "cd '$BEFORE' && unset PYTHONPATH && . benchmarks/namespace.sh && ${STARTUP[*]}"
  fi
  step start_now 100 "${STARTUP[@]}"
  step start_gateways_one_by_one 100 "${STARTUP[@]}" -p benchmarks.sequential_gateways
  step plain_now 220 python3 benchmarks/throughput.py scaling --gpus 1 --warm-workers on,kept --repeat 3
  if [ -n "${BEFORE:-}" ]; then
    step plain_before 110 bash -c "cd '$BEFORE' && unset PYTHONPATH && . benchmarks/namespace.sh && \
      python3 benchmarks/throughput.py scaling --gpus 1 --warm-workers kept --repeat 3"
  fi
  ;;
causes)
  nvidia-smi -L | tee "$OUT/summary.txt"
  rm -rf failures reports reports-*
  step sanitizer_catches 150 "${PYTEST[@]}" properties/test_edge_shapes.py -k single_token -n 0 -q \
    --run-report=none --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 --max-examples=2
  grep -m 12 -E "Invalid __global__|bytes after|SanitizerError|case file|failed|passed" \
    "$OUT/sanitizer_catches.log" | cut -c1-300 >>"$OUT/summary.txt"
  step one_defect 110 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --max-examples=40 \
    --impl=tests/impls/nonpositive_scale_nan.py:run --run-report=reports-one-defect
  step seed_suite 120 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --max-examples=30 \
    --impl=tests/corpus/seed_original.py:run --run-report=reports-seed --failures-dir=failures-seed
  step test_isolation 140 "${PYTEST[@]}" tests/test_isolation.py -n 12 -q
  for report in reports-*/*/report.md; do
    { echo "#### $report"; sed -n '1,/^| property/p' "$report" | head -n 90 | cut -c1-400; } >>"$OUT/verdicts.md"
  done
  for saved in reports-*/*/causes.json; do
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[1]); [print(" ", c["summary"],
      "|", len(c["properties"]), "properties |", c["representative"]["case"][:160]) for c in d["causes"]];
      print("  probes", d["probes"]["used"], d["probes"]["stopped"])' "$saved" >>"$OUT/causes.txt"
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
sanitizer)
  nvidia-smi -L | tee "$OUT/summary.txt"
  step sanitizer_direct 120 bash benchmarks/sanitizer_direct.sh
  cat "$OUT/sanitizer_direct.log" >>"$OUT/summary.txt"
  step sanitizer_probe 50 python3 benchmarks/sanitizer_probe.py tests/impls/reads_one_past.py:run --lengths 3,130
  step hang_test 60 "${PYTEST[@]}" tests/test_isolation.py -n 0 -q -k hang
  ;;
reach)
  nvidia-smi -L | tee "$OUT/summary.txt"
  rm -rf failures reports reports-*
  step sanitizer_probe 80 python3 benchmarks/sanitizer_probe.py tests/impls/reads_one_past.py:run
  step sanitizer_suite 110 "${PYTEST[@]}" properties/test_edge_shapes.py -k single_token -n 0 -q -x \
    --run-report=none --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 --max-examples=1
  step test_isolation 230 "${PYTEST[@]}" tests/test_isolation.py -n 20 -q --durations=8
  step throughput_isolation 160 python3 benchmarks/throughput.py isolation --device cuda --workers auto \
    --isolation off,on --repeat 1 --max-examples 10
  [ -n "${FAMILY:-}" ] || { tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log; exit 0; }
  PYTHONPATH=.carry/sglang step sglang_family 150 "${PYTEST[@]}" properties -n auto --definition=all \
    --hypothesis-profile=gpu --max-examples=15 --impl=adapters/sglang_decode.py:run --run-report=reports-sglang
  step cudnn_causes 120 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --max-examples=25 \
    --impl=adapters/torch_sdpa.py:cudnn --run-report=reports-cudnn --failures-dir=failures-cudnn
  for report in reports-*/*/report.md; do
    { echo "#### $report"; sed -n '1,/^| property/p' "$report" | head -n 70 | cut -c1-400;
      grep -E '\| (FAILED|CRASHED|error) \|' "$report" | cut -c1-300; } >>"$OUT/verdicts.md"
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
verdicts)
  nvidia-smi -L | tee "$OUT/summary.txt"
  rm -rf failures reports
  step hostile_panel 90 "${PYTEST[@]}" tests/test_isolation.py -n 4 -q
  step faulting_kernel 50 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu -q --mps=off \
    --impl=tests/impls/out_of_bounds_kernel.py:run --run-report=reports-faulting
  step sanitizer_catches 50 "${PYTEST[@]}" properties/test_decode.py -n 0 -q --run-report=none \
    --impl=tests/impls/reads_one_past.py:run --sanitize=memcheck --sanitize-every=1 --max-examples=5
  step sanitizer_off 20 "${PYTEST[@]}" properties/test_decode.py -n 0 -q --run-report=none \
    --impl=tests/impls/reads_one_past.py:run --max-examples=50
  step seed_huge_pool 50 "${PYTEST[@]}" properties/test_huge_pools.py -n 0 -q --hypothesis-profile=gpu \
    --impl=tests/corpus/seed_original.py:run --run-report=none
  step one_defect 90 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu \
    --impl=tests/impls/nonpositive_scale_nan.py:run --run-report=reports-one-defect
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/memory.csv" &
  sampler=$!
  step huge_pool_shrink_memory 35 "${PYTEST[@]}" properties/test_huge_pools.py -n 0 -q --hypothesis-profile=gpu \
    --impl=tests/impls/nonpositive_scale_nan.py:run --run-report=none
  kill "$sampler"
  echo "peak GPU memory during the huge-pool shrink (MiB): $(sort -n "$OUT/memory.csv" | tail -n 1)" \
    | tee -a "$OUT/summary.txt"
  for solution in tests/solutions/gqa_paged_decode_*.json; do
    name=$(basename "$solution" .json)
    step "solution_${name:17:10}" 50 "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --max-examples=60 \
      --impl="$solution" --failures-dir="failures-${name:17:10}" --run-report="reports-${name:17:10}"
  done
  for report in reports-*/*/report.md; do
    { echo "#### $report"; sed -n '1,/^| property/p' "$report" | head -n 60
      grep -E '\| (FAILED|CRASHED|error) \|' "$report" | cut -c1-400; } >>"$OUT/verdicts.md"
  done
  for case_file in $(ls failures-*/*.pt 2>/dev/null | head -n "${REPLAYS:-4}"); do  # replays on the GPU
    { echo "-- replay $case_file"; timeout 20 python3 -m gqa_decode_fuzz.record.repro "$case_file" --no-png 2>&1 | head -n 30; } \
      >>"$OUT/replays.txt"
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  tar czf "$OUT/failures.tgz" failures failures-* 2>/dev/null || true
  ;;
profile)
  # Where single properties spend their time in one process (-n 0): a first pass fills the Triton cache, the
  # second runs under cProfile; its top functions per property go to one file. PROPERTIES and EXAMPLES override.
  : >"$OUT/summary.txt"
  for node in ${PROPERTIES:-properties/test_layouts.py properties/test_metamorphic.py::test_inputs_are_left_unchanged \
      properties/test_bad_input.py properties/test_huge_pools.py}; do
    name=$(basename "${node//::/-}" .py)
    for pass in warm profile; do
      profiler=()
      [ "$pass" = profile ] && profiler=(-m cProfile -o "$OUT/$name.prof")
      step "$pass-$name" 90 python3 "${profiler[@]}" -m pytest -p no:cacheprovider "$node" -n 0 -q \
        --hypothesis-profile=gpu --max-examples="${EXAMPLES:-100}" --run-report=none
    done
    { echo "#### $node"; python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('cumulative')
s.print_stats(45); s.sort_stats('tottime').print_stats(25)" "$OUT/$name.prof" | cut -c1-200; } >>"$OUT/profiles.txt"
    rm -f "$OUT/$name.prof"
  done
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls ./*.log) && rm -f "$OUT"/*.log
  ;;
panel)
  # One member at a time on all the workers -n auto gives (the plain command, --contract=correct); a member
  # cut at its limit is interrupted (SIGINT), so its run report still counts the examples it ran.
  : >"$OUT/summary.txt"
  for impl in ${PANEL:-tests/impls/panel_*.py}; do
    name=$(basename "$impl" .py)
    step "$name" "${PANEL_LIMIT:-130}" "${PYTEST[@]}" properties -n auto --hypothesis-profile=gpu --contract=correct \
      --max-examples="${PANEL_EXAMPLES:-900}" --failures-dir="failures-$name" --run-report="reports-$name" \
      "--impl=$impl:run"
    for report in "reports-$name"/*/report.md; do
      echo "== $report" >>"$OUT/summary.txt"
      grep -m1 '^\*\*' "$report" >>"$OUT/summary.txt"
      grep -A4 '^| GPU' "$report" >>"$OUT/summary.txt"
      { echo "# $name"; cat "$report"; } >>"$OUT/panel_reports.md"  # one file: few files come back
    done
  done
  ;;
faults)
  : >"$OUT/summary.txt"
  rm -rf failures reports  # this run's case files only
  watch_resources &
  watcher=$!
  step seed_all_workers 300 "${PYTEST[@]}" properties -n auto --workers-per-gpu=8 --hypothesis-profile=gpu \
    --impl=tests/corpus/seed_original.py:run
  kill "$watcher"
  cat "$OUT/resources.txt" >>"$OUT/summary.txt"
  ls -l failures/*.pt 2>/dev/null | awk '{print $5, $9}' | sort -n | tail -n 40 >>"$OUT/summary.txt"
  step faulting_no_xdist 120 "${PYTEST[@]}" properties -n 0 --hypothesis-profile=gpu \
    --impl=tests/impls/out_of_bounds_kernel.py:run
  tar czf "$OUT/failures.tgz" failures
  ;;
*)
  echo "usage: $0 suite|family|panel|faults|speed|profile|adapters|prefill-adapters|..." >&2
  exit 2
  ;;
esac
