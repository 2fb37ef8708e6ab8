"""A training job judged by a model: the tiny policy at RL start is also the judge (a second
engine, never updated). Its random judgments are malformed, so every RL row counts judge errors
(scored 0 by the preset's ``on_error: zero``) and the run completes."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from train_cli import FAST, main_in_process

from jaxrl_agents.jobs.build import build_chat, build_model
from jaxrl_agents.jobs.config import ChatSpec, ConfigError, ModelSpec, RunConfig, build
from jaxrl_agents.jobs.export import export_policy
from jaxrl_agents.jobs.judge import build_judge, check_judge, start_judge
from jaxrl_agents.types import EndReason, Task, Trajectory, Turn


def test_a_tiny_model_judge_counts_its_garbage_as_judge_errors(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    judge = ["reward=judged", "judge.enabled=true", "judge.on=trajectory", "judge.max_new_tokens=8"]
    argv = [*FAST, f"run_dir={run}", *judge, "trainer.eval.every=0"]
    code = main_in_process(argv, monkeypatch)
    assert code == 0, capsys.readouterr().err[-3000:]
    assert (run / "summary.json").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert len(rl) == 2
    for r in rl:
        assert r["judge/calls"] + r["judge/cache_hits"] > 0
        assert r["judge/errors"] > 0 and r["judge/s"] >= 0.0
        assert r["reward/judge"] == 0.0  # every malformed judgment scored 0, not a crash


def _cfg(**judge) -> RunConfig:
    tree = {"reward": {"terms": [{"name": "outcome"}]}, "judge": judge}
    return build(RunConfig, tree)


@pytest.mark.parametrize(
    ("judge", "terms", "match"),
    [
        ({"enabled": True}, None, "no reward term uses it"),
        ({"enabled": False}, "model", "judge.enabled=false"),
        ({"enabled": True, "model": "/nowhere"}, "model", "judge.model='/nowhere'"),
        ({"enabled": True, "max_prompt_tokens": 1000}, "model", "sampler.max_seq_len"),
    ],
)
def test_judge_settings_are_checked_with_the_key_named(judge, terms, match):
    cfg = _cfg(**judge)
    if terms is not None:
        cfg.reward = type(cfg.reward).from_dict(
            {"terms": [{"name": "judge", "params": {"name": terms}}]}
        )
    with pytest.raises(ConfigError, match=match):
        check_judge(cfg)


def test_a_bad_judge_value_names_its_key():
    with pytest.raises(ConfigError, match="judge.on"):
        _cfg(on="turns")


def test_a_checkpoint_judge_samples_with_its_own_engine(tmp_path):
    """``judge.model=<HF folder>``: built with the policy's model builder, its chat format from
    the folder's tokenizer; its random judgment is sampled once, then a cache hit."""
    init = {
        "model_type": "qwen2",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    }
    chat = build_chat(ChatSpec())
    model = build_model(ModelSpec(init=init), vocab_size=len(chat.tokenizer))
    folder = export_policy(model, chat.tokenizer, RunConfig(), tmp_path / "judge")
    tree = {
        "reward": {"terms": [{"name": "judge", "params": {"name": "model"}}]},
        "judge": {"enabled": True, "model": str(folder), "max_new_tokens": 4},
        "sampler": {"max_slots": 2, "max_seq_len": 512, "prefill_buckets": [128, 512]},
    }
    cfg = build(RunConfig, tree)
    check_judge(cfg)
    rt = build_judge(cfg, policy_chat=None)
    assert rt.model is not None and rt.judge.chat.tokenizer is not chat.tokenizer
    traj = Trajectory(
        task=Task("t", "toy", "train", {}),
        messages=[{"role": "user", "content": "What is 6*7?"}],
        tools=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        prompt_len=0,
        turns=[Turn(index=0, start=0, end=1, text="42")],
        end_reason=EndReason.ANSWERED,
    )

    async def judge_twice():
        async with contextlib.AsyncExitStack() as stack:
            await start_judge(rt, stack, reference=lambda: None)
            text = await rt.judge.judgment_text(traj)
            again = await rt.judge.judgment_text(traj)
        assert rt.judge.engine is None  # detached when the run's stack closes
        return text, again

    text, again = asyncio.run(judge_twice())
    assert text == again and isinstance(text, str)
    assert (rt.judge.stats.calls, rt.judge.stats.cache_hits) == (1, 1)
