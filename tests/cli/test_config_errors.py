"""Every config group: a typo'd key and a bad value stop the command with one line on stderr
that names the dotted key (and, where there is a list, what is valid), before anything compiles.

The entry points' ``main()`` run in-process with a patched ``sys.argv``, exactly what the console
scripts run; every case fails before the job builds a model, so each takes well under a second.
"""

from __future__ import annotations

import sys

import pytest

from jaxrl_agents.cli import eval as eval_cli
from jaxrl_agents.cli import export as export_cli
from jaxrl_agents.cli import train as train_cli

TRAIN = [
    # (overrides, needles that must all appear in the one line)
    (["model.dtyp=float32"], ["'model.dtyp'", "valid keys", "dtype"]),
    (["model.dtype=float16"], ["model.dtype", "float32 or bfloat16"]),
    (["env.tool_timeout=5"], ["'env.tool_timeout'", "tool_timeout_s"]),
    (["env.tool_timeout_s=-1"], ["env.tool_timeout_s", "> 0"]),
    (["env.name=nope"], ["env.name", "calculator"]),
    (["chat.tokenzer=x"], ["'chat.tokenzer'", "tokenizer"]),
    (["chat.tool_parser=xml"], ["chat.tool_parser=xml", "auto, hermes, llama3_json"]),
    (["chat.template=nope"], ["chat.template=nope", "qwen2.5, tiny", "file or folder"]),
    (["chat.tokenizer=/nonexistent"], ["chat.tokenizer=/nonexistent", "not a folder"]),
    (["chat.thinking=false"], ["chat.thinking", "no enable_thinking switch"]),
    (["+env.options.bogus=1"], ["env.options", "bogus"]),
    (["+env.tasks.bogus=1"], ["env.tasks.bogus", "two_step_frac"]),
    (["reward.termz=[]"], ["'reward.termz'", "terms"]),
    (["reward.terms=[{name: outcome, weight: abc}]"], ["reward.terms", "weight", "abc"]),
    (["reward.terms=[{name: outcom}]"], ["reward.terms[0].name", "outcome"]),
    (["trainer.rl.dynamic_sampling_on=accuracy"], ["dynamic_sampling_on='accuracy'", "outcome"]),
    (["advantage.epz=1"], ["'advantage.epz'", "valid keys", "eps"]),
    (["advantage.gamma=2"], ["advantage.gamma", "[0, 1]"]),
    (["advantage.name=gpro"], ["advantage.name", "grpo"]),
    (["advantage=gpro"], ["advantage/gpro", "available", "grpo"]),
    (["loss.clip=0.1"], ["'loss.clip'", "clip_low"]),
    (["loss.agg_mode=mean"], ["loss.agg_mode", "token-mean"]),
    (["optimizer.learning_rate=1"], ["'optimizer.learning_rate'", "lr"]),
    (["optimizer.lr=-1"], ["optimizer.lr", "> 0"]),
    (["optimizer.warmup_steps=abc"], ["optimizer.warmup_steps", "abc"]),
    (["sampler.slots=4"], ["'sampler.slots'", "max_slots"]),
    (["sampler.max_slots=0"], ["sampler.max_slots", ">= 1"]),
    (["sampler.cache_dtype=int8"], ["sampler.cache_dtype", "bfloat16"]),
    (["rollout.temp=0.5"], ["'rollout.temp'", "sampling"]),
    (["rollout.sampling.temp=0.5"], ["'rollout.sampling.temp'", "temperature"]),
    (["rollout.sampling.temperature=-1"], ["rollout.sampling.temperature", ">= 0"]),
    (["rollout.sampling.top_p=2.0"], ["rollout.sampling.top_p", "(0, 1]"]),
    (["mesh.shapes=[1]"], ["'mesh.shapes'", "shape"]),
    (["mesh.shape=[3,1,1]"], ["mesh.shape", "3"]),
    (["trainer.rl.stpes=3"], ["'trainer.rl.stpes'", "steps"]),
    (["trainer.rl_stpes=3"], ["'trainer.rl_stpes'", "valid keys: batching"]),
    (["trainer.sft.steps=-5"], ["trainer.sft.steps", ">= 0"]),
    (["trainer.checkpoint.keep=0"], ["trainer.checkpoint.keep", ">= 1"]),
    (["trainer.rl.minibatches=3"], ["trainer.rl.minibatches", "divisor"]),
    (["+env.oracle.bogus=1"], ["env.oracle.bogus", "premature_prob"]),
    (["rollout.max_new_tokens=16"], ["rollout.max_new_tokens=16", "at least 24"]),
    (["trainer.batching.seq_buckets=[100]"], ["trainer.batching.seq_buckets", "logprob_chunk"]),
    (["rollout.group_size=1"], ["advantage.name=dr_grpo", "group_size >= 2"]),
    (["advantage=gae", "loss.vf_coef=0"], ["advantage.name=gae", "loss.vf_coef > 0"]),
    (["rollout.max_total_tokens=4096"], ["rollout.max_total_tokens", "sampler.max_seq_len"]),
    (["seed=zero"], ["'seed'", "zero"]),
    (["trainer.batching.microbatches=3"], ["trainer.batching.microbatches=3", "divide"]),
    (["trainer.rl.tasks_per_step=0"], ["trainer.rl.tasks_per_step", ">= 1"]),
    (
        ["trainer.batching.seq_buckets=[16]", "trainer.batching.logprob_chunk=16"],
        ["trainer.batching.seq_buckets (largest)=16", "at least"],
    ),
    (["sampler.max_seq_len=16"], ["rollout.max_total_tokens=384", "sampler.max_seq_len=16"]),
]
EVAL = [
    (["tsks=3"], ["'tsks'", "valid keys", "tasks"]),
    (["split=test"], ["split", "heldout"]),
    (["env=calculator", "env.tool_timeout_s=0"], ["env.tool_timeout_s", "> 0"]),
    (["rollout.sampling.top_k=-1"], ["rollout.sampling.top_k", ">= 0"]),
]
EXPORT = [
    (["whch=best"], ["'whch'", "which"]),
    (["which=worst"], ["which", "latest, best or sft"]),
    (["dtype=int8"], ["dtype", "'int8'", "bfloat16, float32 or float16"]),
]


def _run(main, argv, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = capsys.readouterr()
    return exit_info.value.code, out.err


def _check(code, err, needles, argv):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (argv, code, err[-2000:])
    assert len(lines) == 1, (argv, err[-2000:])
    assert lines[0].startswith("config error: "), (argv, lines[0])
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (argv, needle, lines[0])


@pytest.mark.parametrize("argv, needles", TRAIN, ids=[" ".join(a) for a, _ in TRAIN])
def test_train_errors_are_one_line_naming_the_key(argv, needles, tmp_path, capsys, monkeypatch):
    code, err = _run(train_cli.main, [*argv, f"run_dir={tmp_path}/run"], capsys, monkeypatch)
    _check(code, err, needles, argv)


@pytest.mark.parametrize("argv, needles", EVAL, ids=[" ".join(a) for a, _ in EVAL])
def test_eval_errors_are_one_line_naming_the_key(argv, needles, tmp_path, capsys, monkeypatch):
    argv = [*argv, "policies=[scripted:oracle]", f"out={tmp_path}/eval"]
    code, err = _run(eval_cli.main, argv, capsys, monkeypatch)
    _check(code, err, needles, argv)


@pytest.mark.parametrize("argv, needles", EXPORT, ids=[" ".join(a) for a, _ in EXPORT])
def test_export_errors_are_one_line_naming_the_key(argv, needles, tmp_path, capsys, monkeypatch):
    code, err = _run(export_cli.main, [*argv, f"run_dir={tmp_path}"], capsys, monkeypatch)
    _check(code, err, needles, argv)


def test_full_error_env_var_gives_hydras_own_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["prog", "advantage.epz=1", f"run_dir={tmp_path}"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(Exception, match="epz"):
        train_cli.main()
