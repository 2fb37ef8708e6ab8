"""One process of the multi-process full-job test (run by test_multihost.py).

    python multihost_run_worker.py <process_id> <num_processes> <port> <out_dir> [overrides...]

Runs the real job, ``training.run.run(cfg)``, with the config composed from ``configs/`` (smoke
trainer plus the overrides), under ``jax.distributed`` with gloo; ``num_processes=1`` runs the same
job in one process without it. Each process owns one CPU device. Two things are recorded without
touching the job: every ``Orchestrator.run`` call (which tasks, how many episodes) and the weights
of every push to the sampler (``Components.sampler_model``: what this process samples with and,
last, exports). They land in ``<out_dir>/proc<i>.json`` and ``<out_dir>/proc<i>.npz``.
"""

import json
import os
import sys
from pathlib import Path

# One CPU device per process; the programs are tiny, so compile them with little optimisation.
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
os.environ["JAX_PLATFORMS"] = "cpu"


def main() -> None:
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    overrides = [f"run_dir={out / 'run'}", *sys.argv[5:]]
    if nproc > 1:
        overrides += [
            f"mesh.coordinator_address=127.0.0.1:{port}",
            f"mesh.num_processes={nproc}",
            f"mesh.process_id={pid}",
        ]
    from hydra import compose, initialize_config_dir

    from jaxrl_agents.cli.train import CONFIG_DIR, to_run_config

    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        cfg = to_run_config(compose("config", overrides))

    import numpy as np
    from flax import nnx

    from jaxrl_agents.training import run as job

    calls: list[dict] = []
    pushes: list[dict[str, np.ndarray]] = []

    class CountingOrchestrator(job.Orchestrator):
        async def run(self, tasks, *, group_size=None, **kw):
            trajs = await super().run(tasks, group_size=group_size, **kw)
            calls.append(
                {
                    "engine": type(self.engine).__name__,
                    "group_size": group_size,
                    "tasks": [t.id for t in tasks],
                    "episodes": len(trajs),
                }
            )
            return trajs

    sampler_model = job.Components.sampler_model

    def recording_sampler_model(self, params):
        model = sampler_model(self, params)
        flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
        pushes.append({".".join(map(str, k)): np.asarray(v.get_value()) for k, v in flat})
        return model

    job.Orchestrator = CountingOrchestrator
    job.Components.sampler_model = recording_sampler_model
    summary = job.run(cfg)

    np.savez(
        out / f"proc{pid}.npz",
        **{f"push{i}/{k}": v for i, p in enumerate(pushes) for k, v in p.items()},
    )
    (out / f"proc{pid}.json").write_text(
        json.dumps({"calls": calls, "pushes": len(pushes), "summary": summary}, default=str)
    )


if __name__ == "__main__":
    main()
