"""matplotlib figures for runs and reports (Agg backend: no display needed)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def learning_curve(
    curve: Sequence[dict[str, Any]],
    path: str | Path | io.BytesIO,
    *,
    sft_success: float | None = None,
    rl_success: float | None = None,
) -> None:
    """Reward and success vs RL step; held-out success points and the SFT / final levels."""
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.6))
    steps = [p["step"] for p in curve]
    ax_r.plot(steps, [p["reward"] for p in curve], marker=".", label="mean trajectory reward")
    ax_r.set_xlabel("RL step")
    ax_r.set_ylabel("reward")
    ax_r.grid(alpha=0.3)
    ax_r.legend(loc="lower right")
    ax_s.plot(steps, [p.get("train_success", float("nan")) for p in curve], marker=".",
              alpha=0.6, label="rollout success (sampled)")
    held = [(p["step"], p["heldout_success"]) for p in curve if "heldout_success" in p]
    if rl_success is not None and steps:
        held.append((steps[-1], rl_success))
    if sft_success is not None:
        held.insert(0, (0, sft_success))
        ax_s.axhline(sft_success, color="gray", ls="--", lw=1, label="SFT held-out (greedy)")
    if held:
        ax_s.plot(*zip(*held, strict=True), marker="o", color="C3", label="held-out (greedy)")
    ax_s.set_ylim(-0.02, 1.02)
    ax_s.set_xlabel("RL step")
    ax_s.set_ylabel("success rate")
    ax_s.grid(alpha=0.3)
    ax_s.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
