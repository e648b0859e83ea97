"""The benchmark scripts' pure helpers: the random-model shape builder, the scaling projection, the writer of the
results file, and the agreement of docs/benchmarks.md with that file and with the links into it."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.helpers import REPO

BENCHMARKS = REPO / "docs" / "benchmarks.md"
ANCHOR = re.compile(r'<a id="([\w.-]+)"></a>')
COMMIT = re.compile(r"\b[0-9a-f]{7}\b")


def test_shapes_match_published_parameter_counts():
    from bench.shapes import parameter_count

    # Qwen2.5's published parameter counts, with their real vocabularies (config.json vocab_size)
    assert parameter_count("qwen2.5-0.5b", vocab_size=151936) == 494_032_768
    assert parameter_count("qwen2.5-7b", vocab_size=152064) == 7_615_616_512
    # the benchmark default (32k vocabulary) only shrinks the embedding (tied in 0.5B)
    assert parameter_count("qwen2.5-0.5b") == 494_032_768 - (151936 - 32000) * 896


def test_unknown_shape_names_the_valid_ones():
    from bench.shapes import shape_config

    with pytest.raises(ValueError, match="qwen2.5-0.5b"):
        shape_config("llama-9b")


def test_build_model_folder_loads_and_tokenizes(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.shapes import build_model_folder

    path = build_model_folder("tiny", tmp_path / "m", vocab_size=1000)
    assert not (tmp_path / "m.tmp").exists()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == 1000 and len(tok) <= 1000
    text = "What is 12 + 7?"
    assert tok.decode(tok(text)["input_ids"]) == text
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert model.generation_config.eos_token_id == tok.eos_token_id == 2
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 1000)


def test_step_time_sums_roles_and_overlap_takes_the_slower():
    from bench.scaling import step_time

    kw = dict(rollout_tok_s=100, learner_tok_s=200, gen_tokens=1000, train_tokens=4000, sync_s=1.0, samples=64)
    s = step_time(1, 1, **kw)
    assert (s.gen_s, s.learn_s, s.step_s) == (10.0, 20.0, 31.0)
    assert s.samples_per_s == 64 / 31.0
    two = step_time(2, 2, **kw, learner_efficiency=0.5)  # 2 learners at half efficiency: no faster than one
    assert (two.gen_s, two.learn_s) == (5.0, 20.0)
    assert step_time(1, 1, **kw, overlap=True).step_s == 21.0
    with pytest.raises(ValueError):
        step_time(0, 1, **kw)


def test_projection_tries_every_split_and_puts_the_fastest_first():
    from bench.scaling import project

    kw = dict(rollout_tok_s=100, learner_tok_s=100, gen_tokens=3000, train_tokens=1000, sync_s=0.0, samples=8)
    splits = project(5, **kw, learner_efficiency=1.0)
    assert sorted((s.actors, s.learners) for s in splits) == [(1, 4), (2, 3), (3, 2), (4, 1)]
    # generation is 3x the learning work: 3 actors + 2 learners (10 + 5 s) beat 4 + 1 (7.5 + 10 s)
    assert (splits[0].actors, splits[0].learners, splits[0].step_s) == (3, 2, 15.0)


def test_spread_reports_median_and_range():
    from bench.common import show_spread, spread

    s = spread([30.0, 10.0, 20.0, 25.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (22.5, 10.0, 30.0, 4)
    assert show_spread(spread([3.24, 4.1, 3.9]), " s", 1) == "3.9 s (3.2-4.1, n=3)"


def test_append_result_writes_one_line_per_run_to_the_path_it_is_given(tmp_path, monkeypatch):
    from bench.common import append_result

    results = tmp_path / "results.jsonl"
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(results))
    info = {"host": "h", "cpus": 2, "load_avg": [0.5, 0.4, 0.3], "date": "2026-12-06 10:00 UTC", "commit": "abc1234"}
    append_result("learner", {"ratio": 1.5}, ["--groups", "2"], info=info)
    append_result("rollout", {"tokens_per_s": 10.0}, [], info=info)
    first, second = [json.loads(x) for x in results.read_text().splitlines()]
    assert first["bench"] == "learner" and first["result"] == {"ratio": 1.5}
    assert (first["date"], first["commit"], first["machine"]) == (
        info["date"],
        "abc1234",
        {"host": "h", "cpus": 2, "load_avg": [0.5, 0.4, 0.3]},
    )
    assert first["command"] == "python -m bench.learner --groups 2" and first["arguments"] == ["--groups", "2"]
    assert isinstance(first["dirty"], bool) and second["bench"] == "rollout"


def test_append_run_records_a_train_runs_summary_and_median_steps(tmp_path, monkeypatch):
    """`python -m bench.common append-run`, what bench/gpu/e2e.sh ends with: summary.json plus the median of each
    step part over steps 2..N (step 1 compiles)."""
    from bench import common

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"eval/accuracy_after": 0.5}))
    steps = [{"step": i, "time/step_s": t, "time/sync_s": 0.1} for i, t in ((1, 30.0), (2, 4.0), (3, 6.0), (4, 5.0))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    monkeypatch.setenv("RLFT_BENCH_RESULTS", str(tmp_path / "results.jsonl"))
    monkeypatch.setattr(sys, "argv", ["bench.common", "append-run", "gpu/e2e.sh", str(run), str(run), "run.steps=4"])
    common.main()
    (line,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert line["bench"] == "gpu/e2e.sh" and line["arguments"] == [str(run), "run.steps=4"]
    assert line["command"] == f"bash bench/gpu/e2e.sh {run} run.steps=4"
    assert line["result"] == {
        "eval/accuracy_after": 0.5,
        "median_time/step_s": 5.0,
        "median_time/sync_s": 0.1,
        "steps_timed": 3,
    }


def claim_sections() -> dict[str, str]:
    """docs/benchmarks.md cut at each anchor: {anchor: its text up to the next anchor}."""
    text = BENCHMARKS.read_text()
    marks = list(ANCHOR.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.end() : end] for m, end in zip(marks, ends)}


def test_every_link_into_benchmarks_names_one_of_its_anchors():
    sections = claim_sections()
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for folder in ("rl", "bench", "tests", "envs", "rewards", "conf"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".sh", ".yaml", ".md")]
    broken = [
        f"{path.relative_to(REPO)}: #{anchor}"
        for path in files
        for anchor in re.findall(r"benchmarks\.md#([\w-]+(?:\.[\w-]+)*)", path.read_text())
        if anchor not in sections
    ]
    assert not broken, "links to anchors docs/benchmarks.md lacks:\n" + "\n".join(broken)


def test_the_results_file_backs_each_claim_of_benchmarks_md():
    """Each line of bench/results.jsonl is a whole record; a line that names a claim names an anchor of
    docs/benchmarks.md whose text quotes the line's commit, and every claim that quotes a commit has a line."""
    sections = claim_sections()
    lines = [json.loads(x) for x in (REPO / "bench" / "results.jsonl").read_text().splitlines()]
    wrong = []
    for i, line in enumerate(lines, 1):
        if not {"bench", "date", "commit", "machine", "command", "arguments", "result"} <= set(line):
            wrong.append(f"line {i}: missing {sorted({'bench', 'date', 'commit', 'result'} - set(line))}")
        elif "claim" in line and line["claim"] not in sections:
            wrong.append(f"line {i}: claim {line['claim']!r} is no anchor of docs/benchmarks.md")
        elif "claim" in line and line["commit"] and line["commit"] not in sections[line["claim"]]:
            wrong.append(f"line {i}: commit {line['commit']} is not quoted under #{line['claim']}")
    claimed = {line.get("claim") for line in lines}
    wrong += [
        f"#{a} quotes commits but has no line" for a, t in sections.items() if COMMIT.search(t) and a not in claimed
    ]
    assert not wrong, "\n".join(wrong)
