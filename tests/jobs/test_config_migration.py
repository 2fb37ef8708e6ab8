"""Keys renamed when the ``trainer`` group was split into groups and ``rollout`` took a
``sampling`` record (``jobs.config.RENAMED``) keep working for one release: on the command line,
in a YAML preset and in a run folder's ``config.json``, each read as its new key with a
deprecation line. A run folder made before the change (``tests/data/run_pre_config_split``,
stopped after RL step 1) resumes under the new keys.

config-rename: skip (this file uses the old keys on purpose)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_agents.cli.app import compose
from jaxrl_agents.cli.train import to_run_config
from jaxrl_agents.jobs.config import RENAMED, ConfigError, RunConfig, build, migrate

OLD_RUN = Path(__file__).resolve().parents[1] / "data" / "run_pre_config_split"
# the command that made OLD_RUN (its README), in the new keys
OLD_RUN_ARGS = [
    "trainer=smoke",
    "sampler.max_slots=16",
    "rollout.group_size=2",
    "mesh=single",
    "trainer.checkpoint.export=false",
    "trainer.sft.steps=2",
    "trainer.rl.steps=3",
    "trainer.checkpoint.every=1",
    "trainer.eval.every=1",
    "trainer.eval.heldout_tasks=4",
    "trainer.sft.examples=8",
    "model.init.hidden_size=32",
    "model.init.intermediate_size=64",
    "model.init.num_hidden_layers=1",
    "model.init.num_attention_heads=2",
    "model.init.num_key_value_heads=1",
    "run_dir=old_run",
]


def test_every_old_key_names_a_new_key_that_exists():
    paths = set(_paths(json.loads(json.dumps(_asdict(RunConfig())))))
    assert all(new in paths for new in RENAMED.values())
    assert not any(old in paths for old in RENAMED)
    assert len(set(RENAMED.values())) == len(RENAMED)


def test_old_override_keys_are_read_as_the_new_ones_with_one_line_each(capsys):
    old = [
        "trainer.sft_steps=5",
        "rollout.temperature=0.7",
        "trainer.wandb.mode=offline",
        "trainer.sft_from=/runs/x",
        "trainer.async_checkpoints=false",
    ]
    cfg = to_run_config(compose("config", old))
    err = capsys.readouterr().err.splitlines()
    assert cfg.trainer.sft.steps == 5 and cfg.rollout.sampling.temperature == 0.7
    assert cfg.trainer.log.wandb.mode == "offline" and cfg.trainer.sft.init_from == "/runs/x"
    assert cfg.trainer.checkpoint.async_save is False
    assert cfg.trainer.sft.batch_size == 16  # the preset's other SFT keys are kept
    assert sorted(line for line in err if "deprecated" in line) == sorted(
        [
            "jaxrl-train: trainer.sft_steps is deprecated, use trainer.sft.steps",
            "jaxrl-train: rollout.temperature is deprecated, use rollout.sampling.temperature",
            "jaxrl-train: trainer.wandb is deprecated, use trainer.log.wandb",
            "jaxrl-train: trainer.sft_from is deprecated, use trainer.sft.init_from",
            "jaxrl-train: trainer.async_checkpoints is deprecated, use "
            "trainer.checkpoint.async_save",
        ]
    )
    new = to_run_config(
        compose(
            "config",
            [
                "trainer.sft.steps=5",
                "rollout.sampling.temperature=0.7",
                "trainer.log.wandb.mode=offline",
                "trainer.sft.init_from=/runs/x",
                "trainer.checkpoint.async_save=false",
            ],
        )
    )
    assert new == cfg
    assert "deprecated" not in capsys.readouterr().err


def test_a_yaml_preset_with_old_keys_still_composes(tmp_path, capsys):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "mine.yaml").write_text(
        "defaults:\n  - demo\n  - _self_\nsft_steps: 7\nrl_steps: 3\neval_every: 0\n"
    )
    cfg = to_run_config(
        compose("config", [f"hydra.searchpath=[file://{tmp_path}]", "trainer=mine"])
    )
    assert (cfg.trainer.sft.steps, cfg.trainer.rl.steps, cfg.trainer.eval.every) == (7, 3, 0)
    assert "trainer.eval_every is deprecated, use trainer.eval.every" in capsys.readouterr().err


def test_a_typo_is_still_named_with_the_valid_keys():
    with pytest.raises(ConfigError, match=r"'trainer.sft_stepz'.*valid keys: batching"):
        to_run_config(compose("config", ["trainer.sft_stepz=5"]))


def test_migrate_leaves_its_input_alone_and_merges_sections():
    data = {"trainer": {"wandb": {"project": "p"}, "log": {"wandb": {"mode": "offline"}}}}
    out, moved = migrate(RunConfig, data)
    assert moved == [("trainer.wandb", "trainer.log.wandb")]
    assert out == {"trainer": {"log": {"wandb": {"mode": "offline", "project": "p"}}}}
    assert "wandb" in data["trainer"]  # not changed
    cfg = build(RunConfig, data)
    assert cfg.trainer.log.wandb.project == "p" and cfg.trainer.log.wandb.mode == "offline"


def test_a_run_folder_made_before_the_split_resumes(tmp_path):
    stored = json.loads((OLD_RUN / "config.json").read_text())
    assert "sft_steps" in stored["trainer"] and "temperature" in stored["rollout"]
    shutil.copytree(OLD_RUN, tmp_path / "old_run")
    env = {
        **os.environ,
        "XLA_FLAGS": os.environ["JAXRL_TEST_XLA_FLAGS_ONE_DEVICE"],
        "PYTHONUNBUFFERED": "1",
    }
    p = subprocess.run(
        [sys.executable, "-m", "jaxrl_agents.cli.train", *OLD_RUN_ARGS],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # the stored step: RL step 1 (global step 3 of 2 SFT + 3 RL)
    assert "resuming from checkpoint: stage=rl step=1" in p.stdout, p.stdout[-2000:]
    notes = [line for line in p.stderr.splitlines() if "deprecated" in line]
    assert len(notes) == 1, p.stderr[-3000:]
    assert "config.json uses deprecated keys" in notes[0]
    assert "trainer.sft_steps -> trainer.sft.steps" in notes[0]
    assert "rollout.temperature -> rollout.sampling.temperature" in notes[0]
    assert "different config" not in p.stderr
    run = tmp_path / "old_run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl_heldout_success"] is not None
    rl_steps = [
        json.loads(x)["step"]
        for x in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(x)["stage"] == "rl"
    ]
    assert rl_steps == [1, 2, 3]  # each step logged once
    rewritten = json.loads((run / "config.json").read_text())
    assert rewritten["trainer"]["sft"]["steps"] == 2 and "sft_steps" not in rewritten["trainer"]


def _asdict(cfg):
    import dataclasses

    return dataclasses.asdict(cfg)


def _paths(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        out[key] = v
        if isinstance(v, dict):
            out.update(_paths(v, key))
    return out
