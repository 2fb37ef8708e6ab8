"""The HTML report: produced, well-formed, self-contained, with plots, tables and trajectories;
its JSON holds the same numbers; and it renders in headless Chromium without console errors."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import invalid_then_correct, looping

from jaxrl_agents.envs.calculator import oracle_policy, wrong_policy
from jaxrl_agents.evaluation.report import build_report, write_report
from jaxrl_agents.evaluation.summary import summarize

ROOT = Path(__file__).resolve().parents[2]
_VOID = {"meta", "img", "br", "hr", "link", "input"}


class _Checker(HTMLParser):
    """Strict nesting check plus an inventory of images, tables and <details> blocks."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.imgs: list[str] = []
        self.tables = self.details = 0
        self.external: list[str] = []
        self.classes: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.classes.update((a.get("class") or "").split())
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("data:"):
                self.external.append(a[key])
        if tag == "script":
            self.external.append("<script>")
        self.tables += tag == "table"
        self.details += tag == "details"
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def report(tasks, rollout, tmp_path_factory):
    results = {
        "early": rollout(wrong_policy, tasks),
        "oracle": rollout(oracle_policy, tasks),
        "loop": rollout(looping, tasks),
    }
    snapshots = [
        {"step": 10, "label": "sft", "success": 0.25, "success_ci95": [0.1, 0.5], "best": False},
        {"step": 20, "label": "latest", "success": 0.75, "success_ci95": [0.4, 0.9], "best": True},
        {"step": 30, "label": "latest", "success": 0.5, "success_ci95": [0.2, 0.8], "best": False},
    ]
    html_text, data = build_report(
        results, meta={"env": "calculator", "seed": 0}, snapshots=snapshots, max_pairs=3
    )
    out = tmp_path_factory.mktemp("report")
    return results, html_text, data, write_report(out, html_text, data)


def test_report_is_well_formed_and_self_contained(report):
    results, html_text, _, (html_path, _) = report
    assert html_path.read_text(encoding="utf-8") == html_text
    p = _Checker()
    p.feed(html_text)
    p.close()
    assert p.errors == [] and p.stack == []
    assert p.external == []  # no scripts, no remote images/styles
    # success bars, failure modes, primary-cause-free end reasons, effort, snapshot curve
    assert len(p.imgs) == 5
    for src in p.imgs:
        assert (
            base64.b64decode(src.removeprefix("data:image/png;base64,"))[:8] == b"\x89PNG\r\n\x1a\n"
        )
    # meta, summary, slices, after-results, modes, primary causes, end reasons, rewards,
    # 2 comparisons x 2, snapshots
    assert p.tables == 13
    assert {"tool-call", "role-tool", "role-assistant", "side", "best"} <= p.classes
    assert p.details >= len(results)  # one collapsible section per policy at least


def test_report_numbers_match_json_and_summary(report, tasks):
    results, html_text, data, (_, json_path) = report
    assert json.loads(json_path.read_text()) == json.loads(json.dumps(data, default=str))
    for name, trajs in results.items():
        s = summarize(trajs)
        got = data["policies"][name]
        assert got["success"] == s["success"] and got["failure_modes"] == s["failure_modes"]
        assert f'<td class="l">{name}</td><td>{s["success"]:.3f}</td>' in html_text
    early_vs_oracle = data["comparisons"][0]
    assert early_vs_oracle["names"] == ["early", "oracle"]
    assert early_vs_oracle["gained"] == [t.id for t in tasks] and early_vs_oracle["lost"] == []
    assert len(early_vs_oracle["pairs"]) == 3
    assert data["comparisons"][1]["gained"] == []  # loop solves nothing either
    # Every task is in per_task with its primary cause.
    assert {r[0]["primary_failure"] for r in data["per_task"]["loop"].values()} == {"loop"}
    assert "★" in html_text and "McNemar" in html_text
    # success by the env's slices (calculator: one-step / two-step), with Wilson intervals
    two = sum(len(t.data["steps"]) > 1 for t in tasks)
    assert 0 < two < len(tasks)
    oracle, early = data["policies"]["oracle"]["slices"], data["policies"]["early"]["slices"]
    assert oracle["two-step"]["episodes"] == two == early["two-step"]["episodes"]
    assert oracle["one-step"]["episodes"] == len(tasks) - two
    assert oracle["two-step"]["success"] == 1.0 and early["two-step"]["success"] == 0.0
    lo, hi = early["one-step"]["ci95"]
    assert lo == 0.0 < hi < 1.0 and "Success by slice" in html_text


def test_after_a_tool_result_counts_the_next_move_by_result_kind(report, tasks, rollout):
    _, html_text, data, _ = report
    two = sum(len(t.data["steps"]) > 1 for t in tasks)
    after = {name: data["policies"][name]["after_tool_results"] for name in data["policies"]}
    # The oracle calls again after a two-step problem's first result and answers after the last.
    assert after["oracle"] == {"ok": {"call": two, "answer": len(tasks), "ended": 0}}
    assert after["early"] == {}  # it never calls
    # The loop calls after every result until the turn limit (4) ends the episode.
    assert after["loop"] == {"ok": {"call": 3 * len(tasks), "answer": 0, "ended": len(tasks)}}
    assert "After a tool result, the next turn" in html_text
    # An unknown tool's error, then the oracle's calls: a retry after the error, every time.
    invalid = build_report({"invalid": rollout(invalid_then_correct, tasks)})[1]
    got = invalid["policies"]["invalid"]["after_tool_results"]
    assert got["unknown_tool"] == {"call": len(tasks), "answer": 0, "ended": 0}
    assert got["ok"] == {"call": two, "answer": len(tasks), "ended": 0}


def test_report_escapes_model_text(tasks, rollout):
    def evil(task):
        return lambda messages: {"role": "assistant", "content": "<script>alert(1)</script> 7"}

    html_text, _ = build_report({"evil": rollout(evil, tasks[:1])})
    assert "<script>alert" not in html_text and "&lt;script&gt;alert(1)" in html_text


def test_tool_errors_are_highlighted(tasks, rollout):
    html_text, _ = build_report({"invalid": rollout(invalid_then_correct, tasks[:1])})
    p = _Checker()
    p.feed(html_text)
    assert {"tool-call", "tool-error"} <= p.classes and "unknown_tool" in html_text


def _screenshot(html_path: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "screenshot_report.py"),
            str(html_path),
            "--out",
            str(out),
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists(),
    reason="/usr/bin/chromium not installed (CI does not depend on a browser)",
)
def test_report_opens_in_headless_chromium(report, tmp_path):
    _, _, _, (html_path, _) = report
    shot = tmp_path / "report.png"
    proc = _screenshot(html_path, shot)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no console errors" in proc.stdout
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The same check flags a page that does raise (so a pass above means something).
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFn()</script></body></html>")
    proc = _screenshot(bad, tmp_path / "bad.png")
    assert proc.returncode == 1 and "undefinedFn is not defined" in proc.stderr
