"""A one-node SLURM cluster for the tests of this folder: ``scripts/slurm_cluster.sh start`` once
(installing slurm-wlm and munge with apt when they are missing), ``stop`` at the end.

The tests are skipped, with the script's one-line reason, only when the packages are missing and
cannot be installed here (exit status 3: no apt-get, not root, apt fails); any other start-up
failure fails them. Every test that needs the cluster lives in ``test_slurm.py``, so that
``pytest -n 2 --dist loadfile`` runs them all in one worker: one cluster, started and stopped once.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_cluster.sh"
CANNOT_INSTALL = 3  # the script's exit status when the packages cannot be installed


def _cluster(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment for SLURM commands (``SLURM_CONF`` set) while the cluster runs."""
    env_dir = os.environ.get("JAXRL_SLURM_DIR", "/tmp/jaxrl-slurm")
    proc = _cluster("start", timeout=900)  # a first start may install the packages
    if proc.returncode == CANNOT_INSTALL:
        lines = proc.stderr.strip().splitlines() or ["cannot install slurm-wlm and munge"]
        pytest.skip(lines[-1])
    if proc.returncode != 0:
        _cluster("stop", timeout=120)
        pytest.fail(f"slurm_cluster.sh start failed:\n{proc.stdout}\n{proc.stderr}")
    try:
        yield {**os.environ, "SLURM_CONF": f"{env_dir}/slurm.conf"}
    finally:
        stop = _cluster("stop", timeout=120)
        assert stop.returncode == 0, stop.stderr
