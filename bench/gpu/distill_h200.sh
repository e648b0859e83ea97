#!/usr/bin/env bash
# On-policy distillation on one H200 (issue 42's GPU part): does the student's held-out accuracy rise toward a
# stronger teacher's? (i) The teacher: the GPU demo (+experiment=gpu_smollm2_chain_sum: SmolLM2-135M-Instruct,
# GRPO on reasoning-gym chain_sum, the Unsloth 4-bit learner) trained for $TEACHER_STEPS steps. (ii) The student:
# the base SmolLM2 with algorithm=distill, that run's adapter as its teacher (teacher.adapter; teacher.path null
# serves it on the base the teacher was trained on, the 4-bit learner's NF4 base dequantized), the rollout actor,
# the learner and the teacher engine sharing the one GPU. (iii) A table: teacher, student before, student after,
# steps, seconds; and the student's per-token KL to the teacher by step.
#
#   source /tmp/rlft-env.sh && bash bench/gpu/distill_h200.sh [OUT_DIR]     # on the H200, 8.5 minutes (507 s, warm machine)
#   DRY_CPU=1 bash bench/gpu/distill_h200.sh /tmp/distill_dry                 # the same commands, tiny, on a CPU
#
# TEACHER_STEPS (24), STEPS (16), LR (1e-3: the rate measured on CPU, docs/benchmarks.md) change the runs; a
# plan=true of the distillation layout runs first and stops the script if it does not fit (seconds, no GPU work);
# PLAN_ONLY=1 stops after it, PLAN_GPU_GIB=139 plans for an H200 on a machine without one (tests/unit/test_bench_scripts.py).
# The table's numbers are appended to bench/results.jsonl ($RLFT_BENCH_RESULTS if set), except with DRY_CPU=1.
# The whole script must stay under 9 minutes (one 10-minute command on a lent machine): the distillation run gets
# what is left of BUDGET_S (530) and is cut there; its mid-run evaluation (eval.interval) still gives a number.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/distill_h200}
teacher_steps=${TEACHER_STEPS:-24}
steps=${STEPS:-16}
lr=${LR:-1e-3}
budget=${BUDGET_S:-530}
# the GPU machine has no .venv: its python3 holds torch and /tmp/site the carried wheels (as the Makefile's TEST_PY)
PY=${PY:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}

common=(+experiment=gpu_smollm2_chain_sum run.seed=0 checkpoint.interval=0)
# three roles on one GPU: Ray's fractions sum to 1; vLLM takes 0.25 (actor) + 0.2 (teacher) of the H200's memory,
# which leaves about 75 GiB for the 4-bit learner (it needs about 4, `plan=true` below)
gpu=(cluster.gpus_per_actor=0.3 cluster.gpus_per_learner=0.4 cluster.gpus_per_teacher=0.3)
actor_mem=0.25 teacher_mem=0.2 eval_size=64
small=()
if [[ ${DRY_CPU:-0} == 1 ]]; then  # config errors show here, before any GPU time: same keys, CPU learner, tiny batch
  small=(cluster.use_gpu=false model.learner_backend=peft model.load_in_4bit=false run.prompts_per_step=2
         algorithm.group_size=4 model.max_new_tokens=16 cluster.cpus_per_actor=0.5 cluster.cpus_per_teacher=0.5)
  teacher_steps=${TEACHER_STEPS:-2} steps=${STEPS:-2} actor_mem=0.1 teacher_mem=0.1 eval_size=4
fi
distill=(algorithm=distill cluster.num_teachers=1 "${gpu[@]}" cluster.gpu_memory_utilization=$actor_mem
         cluster.teacher_memory_utilization=$teacher_mem algorithm.lr=$lr run.steps=$steps
         eval.interval=$(( steps / 2 > 0 ? steps / 2 : 1 )))
rm -rf "$out" && mkdir -p "$out"
start=$SECONDS

echo "== plan of the distillation run (nothing starts)"
$PY train.py plan=true "${common[@]}" "${distill[@]}" "${small[@]}" eval.size=$eval_size teacher.adapter="$out/teacher" \
  ${PLAN_GPU_GIB:+plan_gpu_memory_gib=$PLAN_GPU_GIB} | tee "$out/plan.txt"
if grep -q "will not start or not fit" "$out/plan.txt"; then echo "distill_h200: the plan does not fit; nothing run"; exit 1; fi
if [[ ${PLAN_ONLY:-0} == 1 ]]; then exit 0; fi

echo "== (i) the teacher: the GPU demo, $teacher_steps steps -> $out/teacher"
t0=$SECONDS
$PY train.py "${common[@]}" "${small[@]}" eval.size=$eval_size run.steps="$teacher_steps" run.output_dir="$out/teacher"
teacher_s=$(( SECONDS - t0 ))

left=$(( budget - (SECONDS - start) ))
(( left >= 120 )) || left=120  # a slow teacher run still leaves the student its start-up and a few steps
echo "== (ii) the student: algorithm=distill toward it, $steps steps (cut at ${left} s) -> $out/student"
t0=$SECONDS
set +e
timeout --signal=INT --kill-after=30 "$left" $PY train.py "${common[@]}" "${distill[@]}" "${small[@]}" \
  eval.size=$eval_size teacher.adapter="$out/teacher" run.output_dir="$out/student"
rc=$?
set -e
student_s=$(( SECONDS - t0 ))

echo "== (iii) the table ($(date -u '+%Y-%m-%d %H:%M UTC'), total $(( SECONDS - start )) s, distillation exit code $rc)"
DRY_CPU=${DRY_CPU:-0} $PY - "$out" "$teacher_steps" "$teacher_s" "$steps" "$student_s" "$lr" <<'EOF'
import json, os, sys
from pathlib import Path

out, teacher_steps, teacher_s, steps, student_s, lr = Path(sys.argv[1]), *sys.argv[2:]
def summary(run):
    p = out / run / "summary.json"
    return json.loads(p.read_text()) if p.is_file() else {}
def rows(run):
    p = out / run / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.is_file() else []
def acc(x):
    return "n/a" if x is None else f"{x:.3f}"
teacher, student = summary("teacher"), summary("student")
evals = [(r["step"], r["eval/accuracy"]) for r in rows("student") if "eval/accuracy" in r]
kl = [(r["step"], r["distill/kl_per_token"]) for r in rows("student") if "distill/kl_per_token" in r]
last_eval = student.get("eval/accuracy_after", evals[-1][1] if len(evals) > 1 else None)
done = kl[-1][0] if kl else 0
print("| policy | held-out accuracy (greedy, chain_sum) | steps | seconds |")
print("|---|---|---|---|")
print(f"| teacher: base + the GPU demo's adapter | {acc(teacher.get('eval/accuracy_after'))} | {teacher_steps} | {teacher_s} |")
print(f"| student before (base) | {acc(student.get('eval/accuracy_before', evals[0][1] if evals else None))} | 0 | |")
print(f"| student after distillation | {acc(last_eval)} | {done} of {steps} | {student_s} |")
print("student evaluations (step, accuracy):", [(s, round(a, 3)) for s, a in evals])
print("distill/kl_per_token by step:", [round(k, 3) for _, k in kl])
if os.environ["DRY_CPU"] != "1":  # a dry run checks the commands; it measures nothing
    from bench.common import append_result

    result = {
        "teacher": {"accuracy_after": teacher.get("eval/accuracy_after"), "steps": int(teacher_steps), "s": int(teacher_s)},
        "student": {"evaluations": evals, "steps_done": done, "steps": int(steps), "s": int(student_s), "lr": float(lr)},
        "kl_per_token": [round(k, 4) for _, k in kl],
    }
    append_result("gpu/distill_h200.sh", result, [str(out)], command=f"bash bench/gpu/distill_h200.sh {out}")
EOF
