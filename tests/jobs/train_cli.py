"""``jaxrl-train`` for the job tests: the smoke-sized overrides they share, and the command run
in-process (its compiled programs shared with the rest of the worker's tests)."""

from __future__ import annotations

import sys

FAST = ["trainer=smoke", "sampler.max_slots=16", "rollout.group_size=2", "mesh=single",
        "trainer.checkpoint.export=false", "trainer.eval.heldout_tasks=2"]  # fmt: skip


def main_in_process(argv: list[str], monkeypatch) -> int | str | None:
    """``jaxrl-train *argv`` in this process: its exit code (0 on success)."""
    from jaxrl_agents.cli import train as cli

    monkeypatch.setattr(sys, "argv", ["jaxrl-train", *argv])
    try:
        cli.main()
    except SystemExit as e:
        return e.code
    return 0
