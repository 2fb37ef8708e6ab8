"""jaxrl-eval's runner: policy specs, the Hydra config, scripted end to end, and snapshot
selection over real orbax checkpoints of a (hand-made, tiny) run folder."""

from __future__ import annotations

import dataclasses
import json

import pytest

from jaxrl_agents.evaluation.policies import PolicySpec, mark_best
from jaxrl_agents.jobs.config import EnvSpec, EvalConfig
from jaxrl_agents.jobs.evaluate import resolve_setup, run_evaluation, select_snapshot

TINY = {
    "model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}  # fmt: skip
ENV = {"name": "calculator", "tasks": {"two_step_frac": 0.0}}


def test_cli_config_and_scripted_end_to_end(tmp_path):
    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.eval import to_eval_config

    c = compose("eval", ["policies=[scripted:wrong,scripted:oracle]", "env=calculator",
                         "tasks=6", f"out={tmp_path}"])  # fmt: skip
    cfg = to_eval_config(c)
    assert cfg.tasks == 6 and cfg.samples == 1 and cfg.env.name == "calculator"
    data = run_evaluation(cfg, progress=None)
    tasks = resolve_setup(cfg, []).tasks
    assert data["comparisons"][0]["gained"] == [t.id for t in tasks]  # every task flips
    assert data["policies"]["scripted:oracle"]["success"] == 1.0
    assert data["policies"]["scripted:oracle"]["reward_terms"] == {"outcome": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report.html", "report.json",
        "trajectories_scripted_oracle.jsonl", "trajectories_scripted_wrong.jsonl",
    ]  # fmt: skip


def test_bad_specs_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        PolicySpec.parse(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert PolicySpec.parse(str(tmp_path)).kind == "hf"
    with pytest.raises(ValueError, match="only applies to jaxrl-train run folders"):
        PolicySpec.parse(f"{tmp_path}@best")
    with pytest.raises(ValueError, match="'ks=\\[2\\]'|every k must be in"):
        EvalConfig(env=EnvSpec(**ENV), ks=[2])


def test_mark_best_prefers_success_then_reward_then_earlier():
    rows = [
        {"step": 10, "success": 0.5, "mean_reward": 0.1},
        {"step": 20, "success": 0.7, "mean_reward": 0.0},
        {"step": 30, "success": 0.7, "mean_reward": 0.0},  # the last is not the best
        {"step": 40, "success": 0.6, "mean_reward": 0.9},
    ]
    assert mark_best(rows)["step"] == 20
    assert [r["best"] for r in rows] == [False, True, False, False]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run folder with checkpoints at steps 4 (= sft_steps), 8, 12; keep=2 rotates step 4 out of
    latest/, but it is the best by (made-up) held-out success, so best/ keeps it."""
    from jaxrl_agents.jobs import build as B
    from jaxrl_agents.jobs.config import RunConfig, build
    from jaxrl_agents.training.checkpoint import Checkpointer
    from jaxrl_agents.training.step import init_train_state

    run = tmp_path_factory.mktemp("run") / "seed0"
    cfg = build(RunConfig, {"run_dir": str(run), "model": {"init": TINY}, "env": ENV,
                            "trainer": {"sft": {"steps": 4}}})  # fmt: skip
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    tok = B.build_tokenizer(cfg.chat, cfg.model.path)
    ckpt = Checkpointer(
        run / "checkpoints", keep=2, async_save=False, best_metric="heldout_success"
    )
    for i, step in enumerate((4, 8, 12)):
        model = B.build_model(cfg.model, vocab_size=len(tok), seed=i)  # different weights
        state = init_train_state(B.split_params(model)[1], cfg.optimizer.build())
        meta = {"stage": "rl", "stage_step": step - 4}
        ckpt.save(step, state, meta)
        ckpt.save_best(step, state, meta, {"heldout_success": 0.9 - 0.1 * i})
    ckpt.wait()
    ckpt.close()
    return run


def test_snapshot_selection_over_real_checkpoints(tiny_run):
    from jaxrl_agents.generation import EngineConfig
    from jaxrl_agents.jobs.evaluate import load_run
    from jaxrl_agents.jobs.restore import kept_steps
    from jaxrl_agents.rollout.orchestrator import RolloutConfig

    latest, best = kept_steps(tiny_run)
    assert (latest, best) == ([8, 12], [4])
    assert load_run(PolicySpec.parse(f"{tiny_run}@sft"))[3] == 4  # found in best/
    cfg = EvalConfig(
        tasks=1, rollout=RolloutConfig(max_turns=1, max_new_tokens=6, max_total_tokens=256),
        sampler=EngineConfig(max_slots=2, max_seq_len=256, prefill_buckets=(256,),
                             decode_chunk=6),
    )  # fmt: skip
    setup = resolve_setup(cfg, [PolicySpec("run", str(tiny_run))])  # env from the run's config
    rows, by_step = select_snapshot(tiny_run, setup, cfg)
    assert [(r["step"], r["label"], r["trainer_best"]) for r in rows] == [
        (4, "sft", True), (8, "rl", False), (12, "rl", False),
    ]  # fmt: skip
    assert sum(r["best"] for r in rows) == 1
    # The engine's weights really were swapped: each checkpoint scores its tokens differently
    # (greedy tokens of a random tied-embedding model can coincide; logprobs cannot).
    sampled = {s: tuple(t.logprobs[t.prompt_len :]) for s, (t, *_) in by_step.items()}
    assert len(set(sampled.values())) == 3
