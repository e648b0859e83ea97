#!/usr/bin/env bash
# Ours against Unsloth's GRPO recipe (bench/e2e_unsloth.py) on the GPU machine, one side per call, so that each side
# at 7B fits one 10-minute command. Once per machine, bench/gpu/setup.sh has installed the wheels; then, each call
# on a machine that stays up between calls:
#   source /tmp/rlft-env.sh && bash bench/gpu/e2e_unsloth.sh SHAPE build       # the random shape's folder, once
#   source /tmp/rlft-env.sh && bash bench/gpu/e2e_unsloth.sh SHAPE SIDE [ARGS] # SIDE: unsloth | split | colocate
#   source /tmp/rlft-env.sh && bash bench/gpu/e2e_unsloth.sh SHAPE report      # the table of the rows so far
# SHAPE: qwen2.5-7b or qwen2.5-0.5b; ARGS go to bench.e2e_unsloth (e.g. --steps 6, --standby, --actor-memory 0.4).
# Rows accumulate in $ROWS (/tmp/bench-e2e-unsloth: they last while the machine stays up). After every call, a cut
# one included, its rows, logs and metrics (no weights) are copied to $OUT/e2e-unsloth when $OUT is set, so they
# come back; on the CPU machine `python -m bench.e2e_unsloth --shape SHAPE --report-only --out DIR`, DIR holding the
# rows of all the calls, prints the table and appends the comparison to bench/results.jsonl. A side's run is cut at
# BUDGET_S (530) seconds (SIGINT: train.py stops its Ray roles), so a call ends within 9 minutes; a cut run leaves
# no row, only its logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: bash bench/gpu/e2e_unsloth.sh SHAPE build|unsloth|split|colocate|report [bench.e2e_unsloth args]"
shape=${1:?$usage}
side=${2:?$usage}
shift 2
rows=${ROWS:-/tmp/bench-e2e-unsloth}
models=${MODELS:-/tmp/shapes}
budget=${BUDGET_S:-530}
# the GPU machine has no .venv: its python3 holds torch and /tmp/site the carried wheels (as the Makefile's TEST_PY)
PY=${PY:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
bench=($PY -m bench.e2e_unsloth --shape "$shape" --out "$rows" --models "$models" --no-append)

save() {
  [[ -n "${OUT:-}" && -d "$rows" ]] || return 0
  mkdir -p "$OUT/e2e-unsloth"
  (cd "$rows" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) -exec cp --parents {} "$OUT/e2e-unsloth/" \;)
}
trap save EXIT

case "$side" in
  build)
    $PY -m bench.shapes "$shape" "$models/$shape-v32000" --device cuda ;;
  report)
    "${bench[@]}" --report-only "$@" ;;
  unsloth|split|colocate)
    mkdir -p "$rows"
    set +e
    timeout --signal=INT --kill-after=30 "$budget" "${bench[@]}" --sides "$side" "$@"
    rc=$?
    set -e
    echo "== $side: exit code $rc; the rows so far:"
    "${bench[@]}" --report-only "$@"
    exit $rc ;;
  *)
    echo "$usage" >&2; exit 2 ;;
esac
