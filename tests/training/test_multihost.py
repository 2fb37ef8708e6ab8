"""Two local CPU processes under ``jax.distributed`` (gloo) train like one process with the same
global batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("multihost_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(nproc: int, out: Path) -> None:
    port = str(_free_port())
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), str(nproc), port, str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(nproc)
    ]
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, stdout[-4000:]


def test_two_processes_match_one(tmp_path):
    _run(1, tmp_path / "one.npz")
    _run(2, tmp_path / "two.npz")
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert sorted(one.files) == sorted(two.files)
    for k in one.files:
        np.testing.assert_allclose(one[k], two[k], rtol=2e-5, atol=2e-6, err_msg=k)
