"""Typed config building: unknown keys and wrong types fail with the dotted key named."""

import pytest

from jaxrl_agents.jobs.config import ConfigError, RunConfig, build


def test_builds_nested_dataclasses():
    cfg = build(RunConfig, {"seed": 3, "trainer": {"rl": {"steps": 5}}, "optimizer": {"lr": 1e-3}})
    assert cfg.seed == 3 and cfg.trainer.rl.steps == 5 and cfg.optimizer.lr == 1e-3


def test_unknown_key_names_key_and_valid_choices():
    with pytest.raises(ConfigError, match=r"'trainer.rl.stpes'.*valid keys:.*steps"):
        build(RunConfig, {"trainer": {"rl": {"stpes": 5}}})
    with pytest.raises(ConfigError, match=r"'trainer.rl_stpes'.*valid keys: batching, .*, sft"):
        build(RunConfig, {"trainer": {"rl_stpes": 5}})


@pytest.mark.parametrize(
    "data, key",
    [
        ({"seed": "zero"}, "seed"),
        ({"trainer": {"checkpoint": {"resume": 1}}}, "trainer.checkpoint.resume"),
        ({"trainer": {"rl": {"steps": 2.5}}}, "trainer.rl.steps"),
        ({"model": 3}, "model"),
    ],
)
def test_wrong_types(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(RunConfig, data)


def test_value_errors_from_dataclasses_are_config_errors():
    with pytest.raises(ConfigError, match="group_size"):
        build(RunConfig, {"rollout": {"group_size": 0}})
