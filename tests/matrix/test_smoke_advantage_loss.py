"""Path matrix, whole jobs: every config file under configs/advantage and configs/loss runs a
smoke job (2 SFT and 2 RL steps on the tiny model) through ``jaxrl-train``'s entry point (env and
reward files: test_smoke_env_reward.py); the folders are enumerated, so a new file is covered
automatically. Each run must finish, change the parameters and keep them finite, and every one of
its trajectories must end with a reason."""

import pytest
from smoke_job import files, smoke_job

FILES = files("advantage", "loss")


@pytest.mark.parametrize("group, name", FILES, ids=[f"{g}={n}" for g, n in FILES])
def test_config_file_runs_a_smoke_job(group, name, tmp_path, monkeypatch):
    smoke_job(group, name, tmp_path, monkeypatch)
