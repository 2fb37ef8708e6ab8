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
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl_agents.evaluation import plots
from jaxrl_agents.evaluation.compare import Comparison, compare
from jaxrl_agents.evaluation.metrics import evaluation_metrics, group_by_task
from jaxrl_agents.evaluation.summary import FAILURE_MODES, failure_modes, primary_failure
from jaxrl_agents.types import Trajectory

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1200px;
color:#222;line-height:1.35;padding:0 16px}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:.9em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.best td{background:#fff6d5;font-weight:600}
.pos{color:#0a7d32}.neg{color:#b3261e}.muted{color:#777}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
details{border:1px solid #ddd;border-radius:4px;margin:6px 0;padding:4px 8px}
details>summary{cursor:pointer}
.ok{color:#0a7d32;font-weight:600}.fail{color:#b3261e;font-weight:600}
.msg{margin:4px 0;padding:4px 8px;border-left:4px solid #bbb;white-space:pre-wrap;
font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em;overflow-wrap:anywhere}
.role-system{border-color:#999;background:#fafafa}.role-user{border-color:#1f6feb}
.role-assistant{border-color:#8250df}.role-tool{border-color:#bf8700;background:#fffbea}
.tool-call{display:block;background:#efe6ff;border:1px solid #c9b3ff;border-radius:3px;
padding:2px 6px;margin:3px 0}
.tool-error{background:#ffe9e7;border-color:#b3261e}
.ann{font-size:.8em;color:#555;font-family:ui-monospace,Menlo,monospace}
.tag{display:inline-block;background:#eee;border-radius:3px;padding:0 5px;margin:0 2px;
font-size:.8em}.tag.bad{background:#ffe1de;color:#8a1c14}
.side{display:grid;grid-template-columns:1fr 1fr;gap:12px}
"""


# -- small HTML helpers ----------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return _e(x)
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return _e(x)


def _table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    left: int = 1,
    row_class: Sequence[str] | None = None,
) -> str:
    """``left``: number of leading text columns (left-aligned); cells are escaped unless they are
    already markup (``_Raw``)."""

    def cell(tag: str, i: int, v: Any) -> str:
        cls = ' class="l"' if i < left else ""
        body = v.html if isinstance(v, _Raw) else _num(v)
        return f"<{tag}{cls}>{body}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = []
    for r, row in enumerate(rows):
        cls = f' class="{row_class[r]}"' if row_class and row_class[r] else ""
        body.append(f"<tr{cls}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Raw:
    def __init__(self, html_text: str):
        self.html = html_text


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _delta(d: float | int, *, lower_is_better: bool = True) -> _Raw:
    if d == 0:
        return _Raw('<span class="muted">0</span>')
    good = (d < 0) == lower_is_better
    text = f"{d:+.3f}" if isinstance(d, float) else f"{d:+d}"
    return _Raw(f'<span class="{"pos" if good else "neg"}">{text}</span>')


# -- trajectories --------------------------------------------------------------------------------


def _tool_call_html(call: dict[str, Any], error: str | None = None) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    args_text = args if isinstance(args, str) else json.dumps(args, default=str)
    cls = "tool-call tool-error" if error else "tool-call"
    err = f' <span class="tag bad">{_e(error)}</span>' if error else ""
    return f'<span class="{cls}">&#9881; {_e(fn.get("name", "?"))}({_e(args_text)}){err}</span>'


def trajectory_html(traj: Trajectory, *, title: str | None = None, open_: bool = False) -> str:
    """One trajectory as a collapsible block: verdict line, then every message; assistant turns
    show their tool calls (errors in red), sampler finish reason and env annotations."""
    modes = [k for k, v in failure_modes(traj).items() if v]
    cause = primary_failure(traj)
    status = '<span class="ok">success</span>' if traj.success else '<span class="fail">fail</span>'
    tags = "".join(f'<span class="tag bad">{_e(m)}</span>' for m in modes)
    head = (
        f"{status} {_e(title or traj.task.id)} <span class='muted'>· {_e(traj.end_reason.value)} · "
        f"{len(traj.turns)} turns · {len(traj.tool_calls)} calls · reward {traj.reward:.3f}"
        f"{' · cause: ' + _e(cause) if cause else ''}</span> {tags}"
    )
    parts = [f"<details{' open' if open_ else ''}><summary>{head}</summary>"]
    info = {k: v for k, v in traj.info.items() if k in ("expected", "answer", "missing_steps")}
    if info:
        parts.append(f'<div class="ann">verdict: {_e(json.dumps(info, default=str))}</div>')
    turn_i = 0
    errors = {r.call.id: r.error_kind.value for r in traj.tool_results if not r.ok and r.call.id}
    for msg in traj.messages:
        role = str(msg.get("role", "?"))
        body = _e(msg.get("content") or "")
        if role == "assistant":
            turn = traj.turns[turn_i] if turn_i < len(traj.turns) else None
            turn_i += 1
            # Malformed calls never reach the message's tool_calls: show them from the turn.
            bad = [c for c in (turn.tool_calls if turn else []) if c.error is not None]
            calls = "".join(
                _tool_call_html(c, errors.get(c.get("id", ""))) for c in msg.get("tool_calls") or []
            ) + "".join(
                _tool_call_html(
                    {"name": c.name or "?", "arguments": c.raw}, f"malformed: {c.error}"
                )
                for c in bad
            )
            body += calls
            if turn is not None:
                ann = {k: v for k, v in turn.annotations.items() if k != "state_key"}
                body += (
                    f'<div class="ann">turn {turn.index} · finish={_e(turn.finish_reason)} · '
                    f"tokens={turn.end - turn.start} · {_e(json.dumps(ann, default=str))}</div>"
                )
        cls = f"msg role-{_e(role)}"
        if role == "tool" and msg.get("tool_call_id") in errors:
            cls += " tool-error"
        parts.append(f'<div class="{cls}"><b>{_e(role)}</b>\n{body}</div>')
    if traj.error:
        parts.append(f'<div class="msg tool-error">{_e(traj.error)}</div>')
    parts.append("</details>")
    return "".join(parts)


def _trajectory_section(name: str, trajs: Sequence[Trajectory], limit: int) -> str:
    # Failures first (the interesting ones), then successes; one sample per task.
    firsts = [g[0] for g in group_by_task(trajs).values()]
    picked = sorted(firsts, key=lambda t: t.success)[:limit]
    blocks = "".join(trajectory_html(t) for t in picked)
    return (
        f"<details><summary><b>{_e(name)}</b>: {len(picked)} of {len(firsts)} tasks "
        f"(failures first)</summary>{blocks}</details>"
    )


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
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _table(["setting", "value"], [(k, _short(v)) for k, v in meta.items()], left=2),
        "<h2>Summary</h2>",
        _summary_table(names, metrics, ks),
        _slices_table(names, metrics),
        _img(
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
        _img(
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
        _img(
            plots.grouped_rates(
                "termination reasons",
                names,
                [metrics[n]["end_reasons"] for n in names],
                [metrics[n]["n"] for n in names],
            ),
            "termination reasons per policy",
        ),
        _img(
            plots.effort_histograms(
                names,
                [[len(t.turns) for t in results[n]] for n in names],
                [[len(t.tool_calls) for t in results[n]] for n in names],
            ),
            "turns and tool calls per episode",
        ),
        _reward_table(names, metrics),
    ]
    for cmp in comparisons:
        out.append(_comparison_section(cmp))
    if snapshots:
        out.append(_snapshot_section(snapshots))
    out.append("<h2>Trajectories</h2>")
    out.extend(_trajectory_section(n, results[n], max_trajectories) for n in names)
    out.append("</body></html>")
    return "\n".join(out), data


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
    return _table(header, rows)


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
    return "<h3>Success by slice (95% CI, episodes)</h3>" + _table(["slice", *names], rows)


def _modes_table(names: list[str], metrics: dict[str, dict]) -> str:
    base = names[0]
    header = ["failure mode", *names, *[f"Δ {n} − {base}" for n in names[1:]]]
    rows = []
    for mode in FAILURE_MODES:
        counts = [metrics[n]["failure_modes"].get(mode, 0) for n in names]
        rows.append([mode, *counts, *[_delta(c - counts[0]) for c in counts[1:]]])
    return _table(header, rows)


def _counts_table(label: str, names: list[str], metrics: dict[str, dict], key: str) -> str:
    keys = sorted({k for n in names for k in metrics[n][key]})
    if not keys:
        return f"<p class='muted'>{_e(label)}: none</p>"
    return _table([label, *names], [[k, *[metrics[n][key].get(k, 0) for n in names]] for k in keys])


def _reward_table(names: list[str], metrics: dict[str, dict]) -> str:
    terms = sorted({k for n in names for k in metrics[n]["reward_term_stats"]})
    rows = []
    for term in terms:
        cells = []
        for n in names:
            s = metrics[n]["reward_term_stats"].get(term)
            cells.append(f"{s['mean']:+.3f} ± {s['std']:.3f}" if s else "–")
        rows.append([term, *cells])
    return "<h3>Reward terms (mean ± std per trajectory)</h3>" + _table(["term", *names], rows)


def _comparison_section(cmp: Comparison) -> str:
    a, b = cmp.names
    parts = [
        f"<h2>Side by side: {_e(a)} → {_e(b)}</h2>",
        _table(
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
                    _delta(cmp.success_delta, lower_is_better=False),
                    f"{cmp.mcnemar_p:.2g}",
                ]
            ],
            left=0,
        ),
        f"<p><b>gained</b>: {_e(', '.join(cmp.gained) or 'none')}</p>",
        f"<p><b>lost</b>: {_e(', '.join(cmp.lost) or 'none')}</p>",
        _table(
            ["failure mode", a, b, "Δ"],
            [[m, na, nb, _delta(nb - na)] for m, (na, nb) in cmp.mode_counts.items()],
        ),
    ]
    for p in cmp.pairs:
        parts.append(
            f"<details><summary>{_e(p.direction)}: {_e(p.task_id)}</summary><div class='side'>"
            f"<div><b>{_e(a)}</b>{trajectory_html(p.a, open_=True)}</div>"
            f"<div><b>{_e(b)}</b>{trajectory_html(p.b, open_=True)}</div></div></details>"
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
    table = _table(
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
    return "<h2>Snapshot selection</h2>" + _img(png, "held-out success per checkpoint") + table
