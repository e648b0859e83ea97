"""Compare runs at equal generated tokens: `python -m bench.sampling_budget RUN_DIR...` (docs/benchmarks.md,
curriculum vs dynamic sampling).

Reads each run's metrics.jsonl and summary.json: cumulative generated tokens (data/generated_tokens, every
dynamic-sampling round included), held-out greedy accuracy at each evaluation (eval.interval), prompts skipped by a
curriculum, wall time. The budget is the smallest total any run generated; each run's accuracy at the budget is its
last evaluation at or below it. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import append_result
from rl.run_files import read_metrics


def load(run: Path) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    tokens, total, skipped, evals = {0: 0.0}, 0.0, 0.0, {}
    for r in rows:
        step = r.get("step", 0)
        total += r.get("data/generated_tokens", 0.0)
        skipped += r.get("curriculum/skipped", 0.0)
        tokens[step] = total
        if "eval/accuracy" in r:
            evals[step] = r["eval/accuracy"]
    return {"tokens": tokens, "total": total, "evals": evals, "skipped": skipped, "summary": summary, "rows": rows}


def at_budget(run: dict, budget: float) -> tuple[int, float]:
    """(step, accuracy) of the last evaluation whose cumulative tokens are within the budget."""
    ok = [s for s in sorted(run["evals"]) if run["tokens"].get(s, float("inf")) <= budget * 1.0001]
    return ok[-1], run["evals"][ok[-1]]


def main() -> None:
    ap = argparse.ArgumentParser(description="Compare runs at equal generated tokens (held-out accuracy, skips, time).")
    ap.add_argument("runs", nargs="+", help="run directories (metrics.jsonl, summary.json)")
    paths = ap.parse_args().runs
    runs = {p: load(Path(p)) for p in paths}
    budget = min(r["total"] for r in runs.values())
    print(f"token budget: {budget:.0f} generated tokens (the smallest total)\n")
    print(
        "| run | steps | generated tokens | held-out acc. (final) | acc. at budget (step) | prompts skipped | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    result = {"budget_tokens": budget, "runs": {}}
    for p, r in runs.items():
        steps = max(r["tokens"])
        step, acc = at_budget(r, budget)
        final = r["evals"][max(r["evals"])]
        wall = r["summary"].get("time/total_s", float("nan"))
        print(
            f"| {Path(p).name} | {steps} | {r['total']:.0f} | {final:.3f} | {acc:.3f} ({step}) | {r['skipped']:.0f} | "
            f"{wall:.0f} |"
        )
        result["runs"][str(p)] = {
            "steps": steps,
            "generated_tokens": r["total"],
            "accuracy_final": final,
            "accuracy_at_budget": acc,
            "at_step": step,
            "prompts_skipped": r["skipped"],
            "wall_s": wall,
        }
    append_result("sampling_budget", result)


if __name__ == "__main__":
    main()
