"""One process of the multi-process full-job test (run by test_multihost.py).

    python multihost_run_worker.py <process_id> <num_processes> <port> <out_dir> [overrides...]

Runs the real job, ``jobs.train.train(cfg, system)``, with the config composed from ``configs/``
(smoke trainer plus the overrides), under ``jax.distributed`` with gloo; ``num_processes=1`` runs
the same job in one process without it. Each process owns one CPU device. Two things are recorded
through the system the job is given (no patching of the job's modules): every ``Orchestrator.run``
call (which tasks, how many episodes; via the collector's ``orchestrator_cls``) and the weights of
every push to the sampler (``TrainSystem.sampler_view``: what this process samples with and, last,
exports). They land in ``<out_dir>/proc<i>.json`` and ``<out_dir>/proc<i>.npz``.
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
    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config

    cfg = to_run_config(compose("config", overrides))

    import dataclasses

    import numpy as np
    from flax import nnx

    from jaxrl_agents import distributed as D
    from jaxrl_agents.jobs.system import build_train
    from jaxrl_agents.jobs.train import train
    from jaxrl_agents.rollout import Collector, Orchestrator

    calls: list[dict] = []
    pushes: list[dict[str, np.ndarray]] = []

    class CountingOrchestrator(Orchestrator):
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

    class CountingCollector(Collector):
        orchestrator_cls = CountingOrchestrator

    D.maybe_initialize(cfg.mesh)
    system = build_train(cfg)
    fields = {f.name: getattr(system.collector, f.name) for f in dataclasses.fields(Collector)}
    system.collector = CountingCollector(**fields)
    sampler_view = system.sampler_view

    def recording_sampler_view(params):
        model = sampler_view(params)
        flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
        pushes.append({".".join(map(str, k)): np.asarray(v.get_value()) for k, v in flat})
        return model

    system.sampler_view = recording_sampler_view
    summary = train(cfg, system)

    np.savez(
        out / f"proc{pid}.npz",
        **{f"push{i}/{k}": v for i, p in enumerate(pushes) for k, v in p.items()},
    )
    (out / f"proc{pid}.json").write_text(
        json.dumps({"calls": calls, "pushes": len(pushes), "summary": summary}, default=str)
    )


if __name__ == "__main__":
    main()
