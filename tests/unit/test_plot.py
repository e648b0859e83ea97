"""`make plot` / `python -m rl.tools.plot`: PNG files from a small metrics.jsonl, for one run and for a sweep folder."""

from __future__ import annotations

import json

from rl.tools import plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ["reward", "eval_accuracy", "response_length", "clip_fraction", "kl", "step_time"]


def write_run(folder, steps: int = 4, reward0: float = 0.2) -> None:
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": 0.25, "time/eval_s": 1.0}]
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "reward/mean": reward0 + 0.1 * s,
                "response/length_mean": 20.0 - s,
                "train/loss": 0.01,
                "policy/clip_frac_low": 0.01,
                "policy/clip_frac_high": 0.02 * s,
                "policy/approx_kl": 0.001 * s,
                "time/rollout_s": 2.0,
                "time/reward_s": 0.1,
                "time/learn_s": 5.0,
                "time/sync_s": 0.5,
                "time/step_s": 8.0,
            }
        )
    rows.append({"step": steps, "eval/accuracy": 0.5, "time/eval_s": 1.0})
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "reward/me'  # a line cut by a kill
    (folder / "metrics.jsonl").write_text(text)


def test_plot_writes_every_figure_for_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run)
    assert plot.main([str(run)]) == 0
    for name in FIGURES:
        data = (run / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    assert "skipped" not in capsys.readouterr().out


def test_plot_sweep_folder_and_missing_metrics(tmp_path, capsys):
    write_run(tmp_path / "sweep" / "0", reward0=0.1)
    write_run(tmp_path / "sweep" / "1", reward0=0.3)
    runs = plot.find_runs(tmp_path / "sweep")
    assert list(runs) == ["0", "1"]
    assert [r["step"] for r in runs["0"]] == [0, 1, 2, 3, 4, 4]  # the cut line is skipped
    written = plot.plot_runs(runs, tmp_path / "out")
    assert sorted(p.stem for p in written) == sorted(FIGURES)
    # a run that logged no PPO diagnostics gets no empty clip/KL figures, and says so
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5, "time/step_s": 1.0}) + "\n")
    written = plot.plot_runs(plot.find_runs(bare), bare / "plots")
    assert sorted(p.stem for p in written) == ["reward", "step_time"]
    assert "skipped clip_fraction.png" in capsys.readouterr().out


def test_plot_fails_on_a_folder_without_metrics(tmp_path):
    assert plot.main([str(tmp_path)]) == 2
