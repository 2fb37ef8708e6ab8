"""Self-contained evaluation reports: one HTML file (plots, tables, trajectories) plus its JSON.

``build_report`` takes each policy's trajectories (same tasks, same seeds), optional snapshot
selection results, and returns ``(html, data)``; ``write_report`` writes ``report.html`` and
``report.json`` (the same numbers) into a folder. The HTML has no external resources and no
script: figures are matplotlib PNGs embedded as base64 ``data:`` URIs, trajectories are collapsible
``<details>`` blocks with tool calls, tool errors and per-turn annotations highlighted, so the file
opens anywhere (mail it, attach it to a PR) and a headless browser renders it without a console
error (``scripts/screenshot_report.py`` checks that).

The first policy is the baseline: every other policy gets a side-by-side section against it
(:func:`~jaxrl_agents.evaluation.compare.compare`).

This module lays out the page and its tables; the stylesheet and HTML helpers are
``evaluation.markup``, the trajectory blocks ``evaluation.trajectory_html``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl_agents.evaluation import plots
from jaxrl_agents.evaluation.compare import Comparison, compare
from jaxrl_agents.evaluation.markup import CSS, delta, esc, html_table, img_png
from jaxrl_agents.evaluation.metrics import NEXT_MOVES, evaluation_metrics, group_by_task
from jaxrl_agents.evaluation.summary import FAILURE_MODES, failure_modes, primary_failure
from jaxrl_agents.evaluation.trajectory_html import trajectory_html, trajectory_section
from jaxrl_agents.types import Trajectory

# -- the report ----------------------------------------------------------------------------------


def build_report(
    results: Mapping[str, Sequence[Trajectory]],
    *,
    title: str = "jaxrl_agents evaluation",
    meta: Mapping[str, Any] | None = None,
    ks: Sequence[int] = (1,),
    snapshots: Sequence[Mapping[str, Any]] | None = None,
    max_trajectories: int = 20,
    max_pairs: int = 6,
) -> tuple[str, dict[str, Any]]:
    """``(html, data)`` for policies ``results`` (name -> trajectories, first = baseline).

    ``snapshots``: rows of snapshot selection (``step``, ``label``, ``success``, ``success_ci95``,
    ``mean_reward``, ``best``), as returned by ``jobs.evaluate.select_snapshot``.
    """
    if not results:
        raise ValueError("build_report: no policies to report")
    names = list(results)
    metrics = {n: evaluation_metrics(results[n], ks=ks) for n in names}
    comparisons: list[Comparison] = [
        compare(results[names[0]], results[n], names=(names[0], n), max_pairs=max_pairs)
        for n in names[1:]
    ]
    meta = {"generated": _dt.datetime.now().isoformat(timespec="seconds"), **(meta or {})}
    data = {
        "meta": meta,
        "policies": metrics,
        "comparisons": [c.to_dict() for c in comparisons],
        "snapshots": [dict(s) for s in snapshots] if snapshots else [],
        "per_task": {n: _per_task(results[n]) for n in names},
    }
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        html_table(["setting", "value"], [(k, _short(v)) for k, v in meta.items()], left=2),
        *_policy_sections(names, results, metrics, ks),
    ]
    for cmp in comparisons:
        out.append(_comparison_section(cmp))
    if snapshots:
        out.append(_snapshot_section(snapshots))
    out.append("<h2>Trajectories</h2>")
    out.extend(trajectory_section(n, results[n], max_trajectories) for n in names)
    out.append("</body></html>")
    return "\n".join(out), data


def _policy_sections(
    names: list[str],
    results: Mapping[str, Sequence[Trajectory]],
    metrics: dict[str, dict],
    ks: Sequence[int],
) -> list[str]:
    """The sections over all policies: summary, failure taxonomy, termination and effort."""
    return [
        "<h2>Summary</h2>",
        _summary_table(names, metrics, ks),
        _slices_table(names, metrics),
        _after_results_table(names, metrics),
        img_png(
            plots.success_bars(
                names,
                [metrics[n]["success"] for n in names],
                [metrics[n]["success_ci95"] for n in names],
            ),
            "success rate per policy",
        ),
        "<h2>Failure taxonomy</h2>",
        "<p>Flags are multi-label (counts of trajectories showing the mode); the primary cause "
        "assigns each failed trajectory exactly one mode.</p>",
        _modes_table(names, metrics),
        img_png(
            plots.grouped_rates(
                "failure modes (share of trajectories)",
                names,
                [metrics[n]["failure_modes"] for n in names],
                [metrics[n]["n"] for n in names],
                keys=FAILURE_MODES,
            ),
            "failure modes per policy",
        ),
        _counts_table("primary cause of failure", names, metrics, "primary_failures"),
        "<h2>Termination reasons and effort</h2>",
        _counts_table("end reason", names, metrics, "end_reasons"),
        img_png(
            plots.grouped_rates(
                "termination reasons",
                names,
                [metrics[n]["end_reasons"] for n in names],
                [metrics[n]["n"] for n in names],
            ),
            "termination reasons per policy",
        ),
        img_png(
            plots.effort_histograms(
                names,
                [[len(t.turns) for t in results[n]] for n in names],
                [[len(t.tool_calls) for t in results[n]] for n in names],
            ),
            "turns and tool calls per episode",
        ),
        _reward_table(names, metrics),
    ]


def write_report(out_dir: str | Path, html_text: str, data: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.json`` into ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path, json_path = out / "report.html", out / "report.json"
    html_path.write_text(html_text, encoding="utf-8")
    json_path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    return html_path, json_path


def _short(v: Any, n: int = 160) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def _per_task(trajs: Sequence[Trajectory]) -> dict[str, list[dict[str, Any]]]:
    return {
        task_id: [
            {
                "sample": t.sample_index,
                "success": t.success,
                "end_reason": t.end_reason.value,
                "turns": len(t.turns),
                "tool_calls": len(t.tool_calls),
                "reward": t.reward,
                "primary_failure": primary_failure(t),
                "failure_modes": [k for k, v in failure_modes(t).items() if v],
            }
            for t in g
        ]
        for task_id, g in group_by_task(trajs).items()
    }


def _summary_table(names: list[str], metrics: dict[str, dict], ks: Sequence[int]) -> str:
    header = [
        "policy",
        "success",
        "95% CI",
        *[f"pass@{k}" for k in ks],
        "tasks solved",
        "turns",
        "tool calls",
        "gen tokens",
        "total tokens",
        "reward",
    ]
    rows = []
    for n in names:
        m = metrics[n]
        lo, hi = m["success_ci95"]
        rows.append(
            [
                n,
                m["success"],
                f"{lo:.3f}-{hi:.3f}",
                *[m[f"pass@{k}"] for k in ks],
                f"{m['tasks_solved']}/{m['tasks']}",
                m["mean_turns"],
                m["mean_tool_calls"],
                m["mean_generated_tokens"],
                m["mean_total_tokens"],
                m["mean_reward"],
            ]
        )
    return html_table(header, rows)


def _slices_table(names: list[str], metrics: dict[str, dict]) -> str:
    """Success per env-named slice (``Ann.SLICES``) with 95% intervals; empty without slices."""
    keys = sorted({k for n in names for k in metrics[n]["slices"]})
    if not keys:
        return ""

    def cell(s: dict[str, Any]) -> str:
        return f"{s['success']:.3f} ({s['ci95'][0]:.2f}-{s['ci95'][1]:.2f}, n={s['episodes']})"

    rows = [
        [k, *[cell(metrics[n]["slices"][k]) if k in metrics[n]["slices"] else "–" for n in names]]
        for k in keys
    ]
    return "<h3>Success by slice (95% CI, episodes)</h3>" + html_table(["slice", *names], rows)


def _after_results_table(names: list[str], metrics: dict[str, dict]) -> str:
    """After a tool result, the next turn: calls again / answers / episode ended, per kind."""
    after = {n: metrics[n].get("after_tool_results", {}) for n in names}
    keys = sorted({k for n in names for k in after[n]})
    if not keys:
        return ""

    def cell(c: dict[str, int] | None) -> str:
        if not c:
            return "–"
        return " / ".join(str(c[m]) for m in NEXT_MOVES)

    rows = [[k, *[cell(after[n].get(k)) for n in names]] for k in keys]
    return (
        "<h3>After a tool result, the next turn (calls again / answers / episode ended)</h3>"
        + html_table(["tool result", *names], rows)
    )


def _modes_table(names: list[str], metrics: dict[str, dict]) -> str:
    base = names[0]
    header = ["failure mode", *names, *[f"Δ {n} − {base}" for n in names[1:]]]
    rows = []
    for mode in FAILURE_MODES:
        counts = [metrics[n]["failure_modes"].get(mode, 0) for n in names]
        rows.append([mode, *counts, *[delta(c - counts[0]) for c in counts[1:]]])
    return html_table(header, rows)


def _counts_table(label: str, names: list[str], metrics: dict[str, dict], key: str) -> str:
    keys = sorted({k for n in names for k in metrics[n][key]})
    if not keys:
        return f"<p class='muted'>{esc(label)}: none</p>"
    return html_table(
        [label, *names], [[k, *[metrics[n][key].get(k, 0) for n in names]] for k in keys]
    )


def _reward_table(names: list[str], metrics: dict[str, dict]) -> str:
    terms = sorted({k for n in names for k in metrics[n]["reward_term_stats"]})
    rows = []
    for term in terms:
        cells = []
        for n in names:
            s = metrics[n]["reward_term_stats"].get(term)
            cells.append(f"{s['mean']:+.3f} ± {s['std']:.3f}" if s else "–")
        rows.append([term, *cells])
    return "<h3>Reward terms (mean ± std per trajectory)</h3>" + html_table(["term", *names], rows)


def _comparison_section(cmp: Comparison) -> str:
    a, b = cmp.names
    parts = [
        f"<h2>Side by side: {esc(a)} → {esc(b)}</h2>",
        html_table(
            [
                "tasks",
                "gained (fail→solve)",
                "lost (solve→fail)",
                "both solved",
                "neither",
                "Δ success",
                "McNemar p",
            ],
            [
                [
                    len(cmp.tasks),
                    len(cmp.gained),
                    len(cmp.lost),
                    cmp.both_solved,
                    cmp.neither_solved,
                    delta(cmp.success_delta, lower_is_better=False),
                    f"{cmp.mcnemar_p:.2g}",
                ]
            ],
            left=0,
        ),
        f"<p><b>gained</b>: {esc(', '.join(cmp.gained) or 'none')}</p>",
        f"<p><b>lost</b>: {esc(', '.join(cmp.lost) or 'none')}</p>",
        html_table(
            ["failure mode", a, b, "Δ"],
            [[m, na, nb, delta(nb - na)] for m, (na, nb) in cmp.mode_counts.items()],
        ),
    ]
    for p in cmp.pairs:
        parts.append(
            f"<details><summary>{esc(p.direction)}: {esc(p.task_id)}</summary><div class='side'>"
            f"<div><b>{esc(a)}</b>{trajectory_html(p.a, open_=True)}</div>"
            f"<div><b>{esc(b)}</b>{trajectory_html(p.b, open_=True)}</div></div></details>"
        )
    return "".join(parts)


def _snapshot_section(rows: Sequence[Mapping[str, Any]]) -> str:
    best = next((r for r in rows if r.get("best")), None)
    steps = [int(r["step"]) for r in rows]
    png = plots.snapshot_curve(
        steps,
        [r["success"] for r in rows],
        [r["success_ci95"] for r in rows],
        best_step=int(best["step"]) if best else -1,
        marks={int(r["step"]): str(r["label"]) for r in rows if r.get("label") == "sft"},
    )
    table = html_table(
        ["step", "checkpoint", "success", "95% CI", "reward", "best"],
        [
            [
                r["step"],
                r.get("label", ""),
                r["success"],
                f"{r['success_ci95'][0]:.3f}-{r['success_ci95'][1]:.3f}",
                r.get("mean_reward", 0.0),
                "★" if r.get("best") else "",
            ]
            for r in rows
        ],
        left=0,
        row_class=["best" if r.get("best") else "" for r in rows],
    )
    return "<h2>Snapshot selection</h2>" + img_png(png, "held-out success per checkpoint") + table
