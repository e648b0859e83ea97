"""The supervised warm start (algorithm=sft): a demonstration becomes the very sample an RL episode with the same
turns becomes (tokens, loss mask), its loss is the masked cross-entropy, and its keys fail in one line."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rl import resolve as specs
from rl.algorithms import get_loss_agg, get_policy_loss
from rl.config.schema import ConfigError
from rl.data.demos import Demonstrations, read_demos, render_conversation
from rl.loop.evaluation import mask_spans
from rl.rollout.episodes import run_episodes
from rl.tools.demos import demonstrations
from rl.types import Completion, EpisodeSpec, PromptRollout, Sampling
from tests.helpers import env_and_reward


def composed(model, tmp_path, *overrides: str):
    """conf/train.yaml with `overrides` (group choices too, as on the command line), typed and resolved."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.config.schema import register_configs
    from rl.tools.demos import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        typed = OmegaConf.to_object(compose(config_name="train", overrides=list(overrides)))
    return specs.resolve(typed, tmp_path / "run", model_path=str(model))


def teacher_forced(texts: list[str], tokenizer):
    """An engine turn function whose model writes `texts` in order (each text's tokens and its EOS), for one
    prompt at a time, as an engine's turns come back."""
    turns = iter(texts)

    def generate(prompts, sampling, max_tokens, seeds):
        out = []
        for p in prompts:
            text = next(turns)
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
            out.append(PromptRollout(p, [Completion(ids, [0.0] * len(ids), "stop", text)], 0))
        return out

    return generate


@pytest.mark.parametrize("env_name", ["calc_products", "retry"])
def test_a_demonstration_renders_as_the_episode_with_its_turns(tiny_model, env_name):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    env, reward = env_and_reward(f"env={env_name}")
    (row,) = demonstrations(env, reward, 1, seed=0)[0]
    item = env.train_items()[row["index"]]
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True)
    prompt = tok.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    (episode,) = run_episodes(teacher_forced(row["turns"], tok), tok, env, [prompt], [item], Sampling(n=1), spec, 0)
    rl = episode.completions[0]
    ids, mask = render_conversation(tok, row["messages"], True, row["tools"])
    assert ids == rl.token_ids and 0 in mask and mask[-1] == 1
    # the episode's mask, less the turns the demonstration marks as context (retry's wrong first answer)
    spans = mask_spans(rl.mask)
    model_turns = [(s, e) for m, s, e in spans if m == 1]
    expected = list(rl.mask)
    for (s, e), turn in zip(model_turns, (m for m in row["messages"] if m["role"] == "assistant")):
        if turn.get("train") is False:
            expected[s:e] = [0] * (e - s)
    assert mask == expected and (expected != rl.mask) == (env_name == "retry")
    assert rl.episode.messages == [{k: v for k, v in m.items() if k != "train"} for m in row["messages"]]


def test_sft_loss_is_the_masked_cross_entropy_of_the_model_tokens():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    loss, _ = get_policy_loss("sft")(logp, torch.zeros(2, 3), torch.zeros(2), mask, agg=get_loss_agg("token_mean"))
    assert loss.item() == pytest.approx((1 + 3 + 0.5 + 0.5) / 4)
    loss.backward()
    assert torch.equal(logp.grad, -mask / 4)  # environment tokens get no gradient


def test_demonstrations_serve_in_seeded_passes_and_drop_what_does_not_fit(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    env, reward = env_and_reward("env=calc_products")
    rows, _ = demonstrations(env, reward, 6, seed=0)
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = composed(tiny_model, tmp_path, "env=calc_products", "algorithm=sft", f"algorithm.demos={path}")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    demos = Demonstrations(cfg.algorithm.demos, tok, cfg.model, budget=cfg.completion_tokens, seed=cfg.run.seed)
    assert len(demos) == 6 and demos.dropped == 0
    first, metrics = demos.next(4)
    second, _ = demos.next(4)  # the pass ends and a new shuffled one begins
    assert demos.cursor == 8 and all(s.advantage == 1.0 for s in first + second)
    assert metrics["sft/demos"] == 4 and metrics["sft/env_tokens_mean"] > 0
    state = demos.state_dict()
    again = Demonstrations(cfg.algorithm.demos, tok, cfg.model, budget=cfg.completion_tokens, seed=cfg.run.seed)
    again.load_state(state)
    assert [s.completion_ids for s in again.next(3)[0]] == [s.completion_ids for s in demos.next(3)[0]]
    short = composed(tiny_model, tmp_path, "algorithm=sft", f"algorithm.demos={path}", "model.max_prompt_tokens=8")
    with pytest.raises(ConfigError, match="all 6 demonstrations are longer than model.max_prompt_tokens=8"):
        Demonstrations(short.algorithm.demos, tok, short.model, budget=short.completion_tokens, seed=short.run.seed)


def test_sft_and_init_adapter_keys_fail_in_one_line(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match=r"algorithm=sft trains on demonstrations: give algorithm.demos=<jsonl>"):
        composed(tiny_model, tmp_path, "algorithm=sft")
    with pytest.raises(ConfigError, match="no such file; write one with python -m rl.tools.demos"):
        composed(tiny_model, tmp_path, "algorithm=sft", "algorithm.demos=/nonexistent.jsonl")
    with pytest.raises(ConfigError, match="algorithm.demos is read by algorithm=sft only"):
        specs.from_overrides(str(tiny_model), f"algorithm.demos={tmp_path}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [{"role": "user", "content": "q"}], "messages": [{"role": "user", "content": "x"}]}\n')
    cfg = composed(tiny_model, tmp_path, "algorithm=sft", f"algorithm.demos={bad}")
    with pytest.raises(ConfigError, match=r"bad.jsonl, line 1: \"messages\" must hold the conversation"):
        Demonstrations(cfg.algorithm.demos, None, cfg.model, budget=cfg.completion_tokens, seed=cfg.run.seed)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    with pytest.raises(ConfigError, match=r"is LoRA rank 8, alpha 16 on \['q_proj'\]; this run's model.lora_rank"):
        specs.from_overrides(str(tiny_model), f"model.init_adapter={adapter}")
    ok = specs.from_overrides(
        str(tiny_model),
        f"model.init_adapter={adapter}",
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "model.lora_targets=[q_proj]",
    )
    assert ok.model.init_adapter == str(adapter.resolve())
    with pytest.raises(ConfigError, match="model.init_adapter=/nonexistent: no such file or folder"):
        specs.from_overrides(str(tiny_model), "model.init_adapter=/nonexistent")


@pytest.mark.parametrize(
    "line, says",
    [
        ("[1, 2]", "a line must be a JSON object with prompt and messages, got list"),
        ('{"prompt": [{"role": "user", "content": "q"}], "messages": ["4"]}', '"messages" must be a list of chat'),
        ('{"prompt": [{"role": "user", "content": "q"}], "messages": [{"role": "assistant", "content": 4}]}', "string"),
        ('{"prompt": [{"role": "user"}], "messages": [{"role": "assistant", "content": "4"}]}', '"prompt" must be'),
    ],
)
def test_a_demonstration_of_the_wrong_shape_is_one_line_naming_its_line(tmp_path, line, says):
    path = tmp_path / "own.jsonl"
    path.write_text(
        '{"prompt": [{"role": "user", "content": "q"}], "messages": [{"role": "assistant", "content": "4"}]}\n'
        + line
        + "\n"
    )
    with pytest.raises(ConfigError, match=rf"own\.jsonl, line 2: .*{re.escape(says)}"):
        read_demos(path)


def test_a_byte_order_mark_is_not_part_of_the_first_demonstration(tmp_path):
    path = tmp_path / "bom.jsonl"
    row = {"prompt": [{"role": "user", "content": "q"}], "messages": [{"role": "assistant", "content": "4"}]}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    assert read_demos(path) == [row]
