"""Trajectories as HTML: one collapsible block per trajectory (verdict line, every message, tool
calls with their errors, per-turn annotations), and a policy's section of them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.evaluation.markup import esc
from jaxrl_agents.evaluation.metrics import group_by_task
from jaxrl_agents.evaluation.summary import failure_modes, primary_failure
from jaxrl_agents.types import Trajectory


def _tool_call_html(call: dict[str, Any], error: str | None = None) -> str:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    args_text = args if isinstance(args, str) else json.dumps(args, default=str)
    cls = "tool-call tool-error" if error else "tool-call"
    err = f' <span class="tag bad">{esc(error)}</span>' if error else ""
    return f'<span class="{cls}">&#9881; {esc(fn.get("name", "?"))}({esc(args_text)}){err}</span>'


def trajectory_html(traj: Trajectory, *, title: str | None = None, open_: bool = False) -> str:
    """One trajectory as a collapsible block: verdict line, then every message; assistant turns
    show their tool calls (errors in red), sampler finish reason and env annotations."""
    modes = [k for k, v in failure_modes(traj).items() if v]
    cause = primary_failure(traj)
    status = '<span class="ok">success</span>' if traj.success else '<span class="fail">fail</span>'
    tags = "".join(f'<span class="tag bad">{esc(m)}</span>' for m in modes)
    end = esc(traj.end_reason.value)
    head = (
        f"{status} {esc(title or traj.task.id)} <span class='muted'>· {end} · "
        f"{len(traj.turns)} turns · {len(traj.tool_calls)} calls · reward {traj.reward:.3f}"
        f"{' · cause: ' + esc(cause) if cause else ''}</span> {tags}"
    )
    parts = [f"<details{' open' if open_ else ''}><summary>{head}</summary>"]
    info = {k: v for k, v in traj.info.items() if k in ("expected", "answer", "missing_steps")}
    if info:
        parts.append(f'<div class="ann">verdict: {esc(json.dumps(info, default=str))}</div>')
    turn_i = 0
    errors = {r.call.id: r.error_kind.value for r in traj.tool_results if not r.ok and r.call.id}
    for msg in traj.messages:
        role = str(msg.get("role", "?"))
        body = esc(msg.get("content") or "")
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
                    f'<div class="ann">turn {turn.index} · finish={esc(turn.finish_reason)} · '
                    f"tokens={turn.end - turn.start} · {esc(json.dumps(ann, default=str))}</div>"
                )
        cls = f"msg role-{esc(role)}"
        if role == "tool" and msg.get("tool_call_id") in errors:
            cls += " tool-error"
        parts.append(f'<div class="{cls}"><b>{esc(role)}</b>\n{body}</div>')
    if traj.error:
        parts.append(f'<div class="msg tool-error">{esc(traj.error)}</div>')
    parts.append("</details>")
    return "".join(parts)


def trajectory_section(name: str, trajs: Sequence[Trajectory], limit: int) -> str:
    # Failures first (the interesting ones), then successes; one sample per task.
    firsts = [g[0] for g in group_by_task(trajs).values()]
    picked = sorted(firsts, key=lambda t: t.success)[:limit]
    blocks = "".join(trajectory_html(t) for t in picked)
    return (
        f"<details><summary><b>{esc(name)}</b>: {len(picked)} of {len(firsts)} tasks "
        f"(failures first)</summary>{blocks}</details>"
    )
