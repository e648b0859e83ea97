#!/usr/bin/env bash
# The GPU half of bench.packs, one part of one side per call of the lent GPU machine (10 minutes a command; the
# machine starts bare whenever it was given back), docs/benchmarks.md#sweep-packs has the call plan:
#   bash bench/gpu/packs.sh SIDE [K/M] [bench.packs args]   # SIDE: sequential | pack2 | pack4 | pack8; K/M: 1/1
#   bash bench/gpu/packs.sh report [bench.packs args]       # the table of the parts carried so far (any machine)
# Each call first runs bench/gpu/setup.sh (installs the wheels the call carried; stops at once where a piece is
# missing), then unpacks the earlier parts carried in $CARRY (.packs-carry/, each a PART.tar.gz an earlier call
# returned; a part already in $RUNS is kept), runs the part with bench.packs --preset gpu --repeats 1 into $RUNS
# (/tmp/bench-packs), cut by SIGINT at $BUDGET_S (530) seconds from the call's start, and prints the table of the
# parts there. With $OUT set (the lent machine), the new part's folder comes back as $OUT/packs/PART.tar.gz (its
# result.json, console.log, each job's summary.json, metrics.jsonl and .hydra/; no adapters, checkpoints or rollout
# dumps; a cut part as PART-cut.tar.gz, never unpacked again, its folder moved to $RUNS-cut/) with the table in
# $OUT/packs/report.txt. Ray processes left from an earlier call's cut part are stopped before the part runs and after
# it, and the GPU's processes, the load average and the host CPU before it are printed. Put the tarballs in
# .packs-carry/ on the CPU machine and name .packs-carry in the next call's `carry`. COMMIT=<hash> names the commit the
# call runs (the machine's git names another: its copy sits in a checkout of the last landed commit).
# The result line is appended by `report` on the CPU machine once every side is whole (there: PY=.venv/bin/python bash
# bench/gpu/packs.sh report).
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: bash bench/gpu/packs.sh sequential|pack2|pack4|pack8 [K/M] [bench.packs args] | report [args]"
side=${1:?$usage}
shift
part=1/1
if [[ $# -gt 0 && $1 =~ ^[0-9]+/[0-9]+$ ]]; then part=$1; shift; fi
carry=${CARRY:-.packs-carry}
runs=${RUNS:-/tmp/bench-packs}
budget=${BUDGET_S:-530}
export RLFT_COMMIT=${COMMIT:-}

unpack() {  # the carried parts into $runs, each unless it is there already
  mkdir -p "$runs"
  for t in "$carry"/*.tar.gz; do
    [[ -e $t && $t != *-cut.tar.gz ]] || continue
    name=$(basename "$t" .tar.gz)
    [[ -e $runs/$name ]] || tar -xzf "$t" -C "$runs"
  done
}

case "$side" in
  report)
    PY=${PY:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
    unpack
    exec "$PY" -m bench.packs --preset gpu --report-only --out "$runs" "$@" ;;
  sequential|pack[0-9]*) ;;
  *)
    echo "$usage" >&2; exit 2 ;;
esac

SETUP_REQUIRE="unsloth bitsandbytes ray hydra reasoning_gym math_verify model vllm" bash bench/gpu/setup.sh
# shellcheck disable=SC1091
source /tmp/rlft-env.sh
PY=${PY:-$([[ -x /opt/torch/.venv/bin/python3 ]] && echo /opt/torch/.venv/bin/python3 || echo python3)}
unpack
before=$(ls "$runs")

stop_leftovers() {  # a part cut by SIGINT may leave its Ray roles (the engine, the learner) running on the GPU
  "$PY" -c "import sys; from ray.scripts.scripts import main; sys.argv = ['ray', 'stop', '--force']; main()" \
    >/dev/null 2>&1 || true
}
stop_leftovers
# what else the part shares the machine with: its times compare with other parts' only where nothing else ran
held=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null || true)
if [[ -n $held ]]; then echo "packs.sh: processes on the GPU before this part:"$'\n'"$held"; fi
echo "packs.sh: load average before this part: $(cut -d' ' -f1-3 /proc/loadavg); host CPU:" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
bench=("$PY" -m bench.packs --preset gpu --repeats 1 --out "$runs" --no-append)

save() {  # the folders this call made, each as one tarball under $OUT/packs, and the table
  stop_leftovers
  [[ -n "${OUT:-}" ]] || return 0
  mkdir -p "$OUT/packs"
  for dir in "$runs"/*/; do
    name=$(basename "$dir")
    grep -qxF "$name" <<<"$before" && continue
    suffix=$([[ -f $dir/result.json ]] && echo "" || echo "-cut")
    (cd "$runs" && find "$name" -type f \( -name result.json -o -name console.log -o -name summary.json \
      -o -name metrics.jsonl -o -path '*/.hydra/*.yaml' \) -print0 |
      tar -czf "$OUT/packs/$name$suffix.tar.gz" --null -T -)
    # a cut part's folder goes aside: left in $runs it would refuse the next call's part of the same side there
    if [[ -n $suffix ]]; then mkdir -p "$runs-cut" && mv "$dir" "$runs-cut/$name-$(date +%s)"; fi
  done
  [[ -f $runs.report.txt ]] && cp "$runs.report.txt" "$OUT/packs/report.txt"
  return 0
}
trap save EXIT

left=$((budget - SECONDS))
if ((left < 120)); then
  echo "packs.sh: the set-up took $SECONDS s of BUDGET_S=$budget; run $side $part in a call of its own" >&2
  exit 1
fi
echo "== $side part $part: $left s left of $budget"
set +e
timeout --signal=INT --kill-after=30 "$left" "${bench[@]}" --sides "$side" --part "$part" "$@"
rc=$?
set -e
echo "== $side part $part: exit code $rc; the parts so far:"
"${bench[@]}" --report-only "$@" 2>&1 | tee "$runs.report.txt" || true
exit $rc
