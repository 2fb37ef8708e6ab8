"""matplotlib figures for runs and reports (Agg backend: no display needed).

``learning_curve`` is the trainer's; the rest return PNG bytes that ``evaluation.report`` embeds.
"""

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
    sft_validation: float | None = None,
    rl_validation: float | None = None,
) -> None:
    """Reward and success vs RL step; validation success points (the keep-best selection) and
    the SFT / final policies' held-out (test) success."""
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.6))
    steps = [p["step"] for p in curve]
    ax_r.plot(steps, [p["reward"] for p in curve], marker=".", label="mean trajectory reward")
    ax_r.set_xlabel("RL step")
    ax_r.set_ylabel("reward")
    ax_r.grid(alpha=0.3)
    ax_r.legend(loc="lower right")
    ax_s.plot(
        steps,
        [p.get("train_success", float("nan")) for p in curve],
        marker=".",
        alpha=0.6,
        label="rollout success (sampled)",
    )
    val = [(p["step"], p["validation_success"]) for p in curve if "validation_success" in p]
    if sft_validation is not None:
        val.insert(0, (0, sft_validation))
    if rl_validation is not None and steps:
        val.append((steps[-1], rl_validation))
    if val:
        ax_s.plot(*zip(*val, strict=True), marker="o", color="C2", label="validation (greedy)")
    test = ([(0, sft_success)] if sft_success is not None else []) + (
        [(steps[-1], rl_success)] if rl_success is not None and steps else []
    )
    if sft_success is not None:
        ax_s.axhline(sft_success, color="gray", ls="--", lw=1, label="SFT held-out (greedy)")
    if test:
        ax_s.plot(
            *zip(*test, strict=True), marker="s", ls=":", color="C3", label="held-out test (greedy)"
        )
    ax_s.set_ylim(-0.02, 1.02)
    ax_s.set_xlabel("RL step")
    ax_s.set_ylabel("success rate")
    ax_s.grid(alpha=0.3)
    ax_s.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


# -- evaluation report figures (PNG bytes, embedded as base64 by ``evaluation.report``) ----------


def figure_png(fig: Any, *, dpi: int = 100) -> bytes:
    """Render and close a figure; returns the PNG file's bytes."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, dpi=dpi, format="png")
    plt.close(fig)
    return buf.getvalue()


def success_bars(
    names: Sequence[str], success: Sequence[float], ci95: Sequence[Sequence[float]]
) -> bytes:
    """Success rate per policy with 95% Wilson intervals as error bars."""
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(names) + 2), 3.2))
    # max(0, .): the Wilson bound can sit a rounding error inside the point estimate at 0 or 1.
    lo = [max(0.0, s - c[0]) for s, c in zip(success, ci95, strict=True)]
    hi = [max(0.0, c[1] - s) for s, c in zip(success, ci95, strict=True)]
    x = range(len(names))
    ax.bar(x, success, yerr=[lo, hi], capsize=5, color=[f"C{i}" for i in x], alpha=0.85)
    for i, s in enumerate(success):
        ax.text(i, min(s + 0.03, 0.97), f"{s:.2f}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(x), list(names), rotation=15 if len(names) > 3 else 0)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% CI)")
    ax.grid(axis="y", alpha=0.3)
    return figure_png(fig)


def grouped_rates(
    title: str,
    names: Sequence[str],
    counts: Sequence[dict[str, int]],
    totals: Sequence[int],
    *,
    keys: Sequence[str] | None = None,
) -> bytes:
    """Horizontal grouped bars: ``counts[p][key] / totals[p]`` for each key and policy ``p``."""
    keys = list(keys or sorted({k for c in counts for k in c}))
    fig, ax = plt.subplots(figsize=(7.5, min(8.0, 1.2 + 0.22 * len(keys) * max(len(names), 1))))
    height = 0.8 / max(len(names), 1)
    for p, (name, c, n) in enumerate(zip(names, counts, totals, strict=True)):
        ys = [i + p * height for i in range(len(keys))]
        ax.barh(
            ys,
            [c.get(k, 0) / max(n, 1) for k in keys],
            height=height,
            label=name,
            color=f"C{p}",
            alpha=0.85,
        )
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(keys))], keys)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("share of trajectories")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return figure_png(fig)


def effort_histograms(
    names: Sequence[str], turns: Sequence[Sequence[int]], tool_calls: Sequence[Sequence[int]]
) -> bytes:
    """Distributions of turns and tool calls per episode, one series per policy."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.0))
    for ax, data, label in ((axes[0], turns, "turns"), (axes[1], tool_calls, "tool calls")):
        top = max((max(d) for d in data if d), default=0)
        bins = [b - 0.5 for b in range(top + 2)]
        for i, (name, d) in enumerate(zip(names, data, strict=True)):
            ax.hist(d, bins=bins, alpha=0.55, label=name, color=f"C{i}")
        ax.set_xlabel(f"{label} per episode")
        ax.set_ylabel("episodes")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    return figure_png(fig)


def snapshot_curve(
    steps: Sequence[int],
    success: Sequence[float],
    ci95: Sequence[Sequence[float]],
    *,
    best_step: int,
    marks: dict[int, str] | None = None,
) -> bytes:
    """Held-out success of every checkpoint of a run (95% CI band), the best one starred."""
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.fill_between(steps, [c[0] for c in ci95], [c[1] for c in ci95], alpha=0.2, color="C0")
    ax.plot(steps, success, marker="o", color="C0", label="held-out success")
    if best_step in steps:
        i = list(steps).index(best_step)
        ax.plot(
            [best_step],
            [success[i]],
            marker="*",
            ms=16,
            color="C3",
            ls="none",
            label=f"best (step {best_step})",
        )
    for step, label in (marks or {}).items():
        ax.axvline(step, color="gray", ls="--", lw=1)
        ax.text(step, 1.01, label, fontsize=8, ha="center", va="bottom", color="gray")
    ax.set_ylim(-0.02, 1.08)
    ax.set_xlabel("global step")
    ax.set_ylabel("success rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return figure_png(fig)
