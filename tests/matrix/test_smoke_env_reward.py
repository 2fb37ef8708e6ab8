"""Path matrix, whole jobs: every config file under configs/env and configs/reward runs in a smoke
job (2 SFT and 2 RL steps on the tiny model) through ``jaxrl-train``'s entry point (advantage and
loss files: test_smoke_advantage_loss.py); the folders are enumerated, so a new file is covered
automatically. Each job runs an env file with a reward file (``smoke_job.paired_jobs``), so each
reward composition also meets an env other than the default one. Each run must finish, change
the parameters and keep them finite, and every one of its trajectories must end with a reason."""

import pytest
from smoke_job import files, paired_jobs, smoke_job

JOBS = paired_jobs("env", "reward")


def test_every_file_is_in_a_job():
    assert {o for job in JOBS for o in job} == {f"{g}={n}" for g, n in files("env", "reward")}


@pytest.mark.parametrize("overrides", JOBS, ids=[",".join(j) for j in JOBS])
def test_config_files_run_a_smoke_job(overrides, tmp_path, monkeypatch):
    smoke_job(overrides, tmp_path, monkeypatch)
