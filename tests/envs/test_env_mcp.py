"""The ``mcp`` env against an MCP server written here (an ``MCPServer`` stdio script in tmp_path):
tools listed with their schemas, results and errors as tool messages, ``jaxrl-eval`` with the
scripted oracle, a server killed mid-episode (``env_error``, nothing left running), ``close``,
an episode timeout, and config errors in one line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap

import pytest

pytest.importorskip("mcp", reason="the mcp env needs the mcp extra (pip install -e '.[mcp]')")

from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer  # noqa: E402
from jaxrl_agents.envs import ENVIRONMENTS, make_env  # noqa: E402
from jaxrl_agents.envs.base import drive  # noqa: E402
from jaxrl_agents.envs.mcp import McpEnv, McpServerError, oracle_policy  # noqa: E402
from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig  # noqa: E402
from jaxrl_agents.rollout.scripted import ScriptedEngine  # noqa: E402
from jaxrl_agents.types import EndReason, ToolCall, ToolErrorKind  # noqa: E402

SERVER = '''
import time
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("test", log_level="ERROR")
TABLE = {"alpha": "17", "beta": "23"}


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def lookup(key: str) -> str:
    """The value of a key."""
    if key not in TABLE:
        raise ToolError(f"no key {key!r}")
    return TABLE[key]


@app.tool()
def wait(seconds: float) -> str:
    """Sleep, then say done."""
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
'''
ROWS = [
    {
        "id": "t1",
        "prompt": "What is 2 plus 40?",
        "answer": "42",
        "split": "heldout",
        "oracle": [{"name": "add", "arguments": {"a": 2, "b": 40}}],
    },
    {
        "id": "t2",
        "prompt": "alpha plus beta?",
        "answer": "40",
        "split": "heldout",
        "oracle": [
            {"name": "lookup", "arguments": {"key": "alpha"}},
            {"name": "lookup", "arguments": {"key": "beta"}},
        ],
    },
    {
        "id": "t3",
        "prompt": "What is beta?",
        "answer": "23",
        "split": "heldout",
        "oracle": [{"name": "lookup", "arguments": {"key": "beta"}}],
    },
    {"id": "t4", "prompt": "What is 1 plus 1?", "answer": "2"},
]


@pytest.fixture
def files(tmp_path):
    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent(SERVER))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    spec = {"name": "test", "command": "python", "args": [str(server)]}
    return {"server": server, "tasks": tasks, "spec": spec}


def leftover(script) -> list[int]:
    """Processes whose parent is this one and whose command line runs ``script`` (/proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and str(script) in cmdline:
            found.append(int(entry))
    return found


def gone(pid: int) -> bool:
    """Reaped: no /proc entry (a zombie still has one)."""
    return not os.path.exists(f"/proc/{pid}")


def heldout(files, n=3, **kw):
    return McpEnv.make_tasks("heldout", n, tasks_file=str(files["tasks"]), **kw)


# -- unit level ------------------------------------------------------------------------------------


def test_tools_results_and_errors_as_messages(files):
    env = make_env("mcp", servers=[files["spec"]], tool_timeout_s=1.0)
    task = heldout(files)[0]

    async def run():
        reset = await env.reset(task)
        schemas = {s["function"]["name"]: s["function"] for s in reset.tools}
        assert sorted(schemas) == ["add", "lookup", "wait"]
        assert schemas["add"]["description"] == "Add two integers."
        assert schemas["add"]["parameters"]["required"] == ["a", "b"]
        assert schemas["add"]["parameters"]["properties"]["a"]["type"] == "integer"
        calls = [
            ToolCall("add", {"a": 2, "b": 40}, "c0"),
            ToolCall("add", {"a": "two", "b": 40}, "c1"),  # rejected by the env's check
            ToolCall("lookup", {"key": "gamma"}, "c2"),  # the tool's isError result
            ToolCall("wait", {"seconds": 5}, "c3"),  # past tool_timeout_s
            ToolCall("nope", {}, "c4"),
        ]
        step = await env.step({"role": "assistant", "content": ""}, calls)
        kinds = [r.error_kind for r in step.tool_results]
        assert kinds == [
            None,
            ToolErrorKind.BAD_ARGUMENTS,
            ToolErrorKind.TOOL_ERROR,
            ToolErrorKind.TIMEOUT,
            ToolErrorKind.UNKNOWN_TOOL,
        ]
        texts = [m["content"] for m in step.messages]
        assert texts[0] == "42"
        assert texts[1].startswith("Error: bad arguments for add: 'a' must be integer")
        assert texts[2].startswith("Error: ") and "no key 'gamma'" in texts[2]
        assert texts[3] == "Error: wait timed out after 1 s"
        step = await env.step({"role": "assistant", "content": "42"}, [])
        assert step.done and (await env.verify()).success
        pid = env.server_pids()["test"]
        await env.close()
        await env.close()  # twice is fine
        return pid

    pid = asyncio.run(run())
    assert gone(pid) and not leftover(files["server"])


def test_colliding_tool_names_get_the_server_prefix(files):
    specs = [{**files["spec"], "name": "one"}, {**files["spec"], "name": "two"}]
    env = McpEnv(servers=specs)

    async def run():
        reset = await env.reset(heldout(files)[0])
        names = sorted(s["function"]["name"] for s in reset.tools)
        step = await env.step({"role": "assistant"}, [ToolCall("two__add", {"a": 1, "b": 2}, "c")])
        assert env.routes["two__add"] == ("two", "add")
        await env.close()
        return names, step.messages[0]["content"]

    names, out = asyncio.run(run())
    assert names == ["one__add", "one__lookup", "one__wait", "two__add", "two__lookup", "two__wait"]
    assert out == "3"
    assert not leftover(files["server"])


class _RecordingEnv(McpEnv):
    """Records its servers' process ids when it closes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.closed_pids: list[int | None] = []

    async def close(self):
        self.closed_pids.extend(self.server_pids().values())
        await super().close()


def test_oracle_solves_and_close_leaves_no_process(files):
    for task in heldout(files):
        env = _RecordingEnv(servers=[files["spec"]])
        verdict, messages, _ = asyncio.run(drive(env, task, oracle_policy(task)))
        assert verdict.success, (task.id, messages)
        [pid] = [p for p in env.closed_pids if p is not None]  # reset's close has none yet
        assert gone(pid)
    assert not leftover(files["server"])


def test_tasks_splits_checks_and_repeats(files):
    tasks = McpEnv.make_tasks("heldout", 5, tasks_file=str(files["tasks"]), check="number")
    assert sorted(t.id for t in tasks[:3]) == ["t1", "t2", "t3"]
    assert [t.id.split("#")[1] for t in tasks[3:]] == ["1", "1"]  # a second seeded pass
    assert all(t.data["check"] == "number" for t in tasks)
    env = McpEnv(servers=[files["spec"]])
    env.task, env.answer = tasks[0], None
    assert not env.judge(None).success
    env.task = next(t for t in tasks if t.id == "t1")
    assert env.judge("The sum is 42.").success and not env.judge("41").success
    env.task.data["check"] = "contains"
    assert env.judge("It is 42, surely").success
    env.task.data["check"] = "exact"
    assert env.judge(" 42\n").success and not env.judge("It is 42").success
    env.task.data["check"] = f"{__name__}:always"
    assert env.judge("anything").success


def always(answer, task):
    return True


# -- through the orchestrator and jaxrl-eval -------------------------------------------------------


def _orchestrator(env_factory, policy_factory, **cfg):
    chat = ChatFormat(load_tiny_tokenizer())
    rollout = {"group_size": 1, "max_turns": 4, "max_new_tokens": 64, "max_total_tokens": 2048}
    return Orchestrator(
        engine=ScriptedEngine(chat, policy_factory=policy_factory),
        chat=chat,
        env_factory=env_factory,
        cfg=RolloutConfig(**{**rollout, **cfg}),
        sampling_params=lambda n, seed: type("P", (), {"max_new_tokens": n, "seed": seed})(),
    )


def test_jaxrl_eval_scripted_oracle_solves_the_tasks(files, tmp_path, monkeypatch):
    from jaxrl_agents.cli import eval as cli

    out = tmp_path / "eval"
    server = f"[{{name: test, command: python, args: ['{files['server']}']}}]"
    argv = [
        "jaxrl-eval",
        "env=mcp",
        f"env.options.servers={server}",
        f"env.tasks.tasks_file={files['tasks']}",
        "env.tasks.check=number",
        "policies=[scripted:oracle,scripted:wrong]",
        "tasks=3",
        "split=heldout",
        "rollout.max_total_tokens=1024",
        "sampler.max_seq_len=1024",
        f"out={out}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    data = json.loads((out / "report.json").read_text())
    assert data["policies"]["scripted:oracle"]["success"] == 1.0
    assert data["policies"]["scripted:wrong"]["success"] == 0.0
    assert data["meta"]["env"] == "jaxrl_agents.envs.mcp.McpEnv"
    assert not leftover(files["server"])


def test_server_killed_mid_episode_ends_it_with_env_error(files):
    task = next(t for t in heldout(files) if t.id == "t2")  # two lookups
    envs, killed = [], []

    def env_factory():
        envs.append(McpEnv(servers=[files["spec"]]))
        return envs[-1]

    def policy_factory(task):
        oracle = oracle_policy(task)

        def policy(messages):
            if any(m["role"] == "tool" for m in messages) and not killed:
                killed.append(envs[-1].server_pids()["test"])  # between the two calls
                os.kill(killed[-1], signal.SIGKILL)
            return oracle(messages)

        return policy

    orch = _orchestrator(env_factory, policy_factory)
    [traj] = asyncio.run(orch.run([task], group_size=1))
    assert traj.end_reason == EndReason.ENV_ERROR, (traj.end_reason, traj.error)
    assert "McpServerError" in traj.error and "is gone" in traj.error
    assert len(traj.turns) == 2 and not traj.success
    assert killed and gone(killed[0])
    assert not leftover(files["server"])


def test_episode_timeout_leaves_no_process(files):
    task = heldout(files)[0]
    pids = []

    def env_factory():
        env = McpEnv(servers=[files["spec"]], tool_timeout_s=60.0)
        real_step = env.step

        async def step(message, tool_calls):
            pids.extend(env.server_pids().values())
            return await real_step(message, [ToolCall("wait", {"seconds": 30}, "w")])

        env.step = step
        return env

    orch = _orchestrator(env_factory, oracle_policy, episode_timeout_s=4.0)
    [traj] = asyncio.run(orch.run([task], group_size=1))
    assert traj.end_reason == EndReason.EPISODE_TIMEOUT
    assert pids and gone(pids[0])
    assert not leftover(files["server"])


def test_a_cancelled_episode_kills_its_server(files):
    env = McpEnv(servers=[files["spec"]], tool_timeout_s=60.0)

    async def episode():
        await env.reset(heldout(files)[0])
        await env.step({"role": "assistant"}, [ToolCall("wait", {"seconds": 30}, "w")])

    async def run():
        task = asyncio.create_task(episode())
        while not env.server_pids():
            await asyncio.sleep(0.05)
        pid = env.server_pids()["test"]
        await asyncio.sleep(0.5)  # inside the call
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # killed at once, reaped by the loop (close is never called)
            if gone(pid):
                break
            await asyncio.sleep(0.05)
        return pid

    assert gone(asyncio.run(run())) and not leftover(files["server"])


def test_a_server_that_cannot_start_raises_and_leaves_nothing(files, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit(3)\n")
    env = McpEnv(
        servers=[files["spec"], {"name": "broken", "command": "python", "args": [str(broken)]}]
    )
    with pytest.raises(McpServerError, match="'broken' failed to start"):
        asyncio.run(env.reset(heldout(files)[0]))
    assert not env.connections and not leftover(files["server"])


def test_a_server_that_does_not_answer_times_out_at_start(files, tmp_path):
    silent = tmp_path / "silent.py"
    silent.write_text("import time\ntime.sleep(60)\n")
    env = McpEnv(
        servers=[{"name": "silent", "command": "python", "args": [str(silent)]}],
        start_timeout_s=1.0,
    )
    with pytest.raises(McpServerError, match="'silent' did not start within 1 s"):
        asyncio.run(env.reset(heldout(files)[0]))
    assert not leftover(silent)


def test_streamable_http_server(files):
    import socket
    import subprocess
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(files["server"]), "--http", str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "no HTTP server"
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        env = McpEnv(servers=[{"name": "web", "url": url}])
        task = heldout(files)[0]
        verdict, messages, _ = asyncio.run(drive(env, task, oracle_policy(task)))
        assert verdict.success and messages[3]["content"] == "42", messages
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- config errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, needles",
    [
        (["env.tasks.check=fuzzy"], ["check='fuzzy'", "exact, contains, number", "pkg.mod:fn"]),
        (
            ["env.tasks.tasks_file=/nonexistent/tasks.jsonl"],
            ["tasks_file='/nonexistent/tasks.jsonl'", "no such file"],
        ),
        (
            ["env.options.servers=[{name: x, command: no-such-mcp-server}]"],
            ["env.options", "servers[0].command='no-such-mcp-server'", "not found"],
        ),
        (
            ["env.options.servers=[{name: x, cmd: python}]"],
            ["servers[0]", "unknown key(s) ['cmd']", "command"],
        ),
    ],
)
def test_config_errors_are_one_line(override, needles, tmp_path, capsys, monkeypatch):
    from jaxrl_agents.cli import eval as cli

    argv = ["jaxrl-eval", "env=mcp", *override, "policies=[scripted:oracle]", f"out={tmp_path}"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("config error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_registered_with_its_scripted_policies():
    from jaxrl_agents.envs import scripted_policies

    assert ENVIRONMENTS["mcp"] is McpEnv
    assert {"oracle", "wrong"} <= set(scripted_policies(McpEnv))
    assert [s.name for s in McpEnv().specs] == ["demo"]  # the demo server by default
    with pytest.raises(ValueError, match="at least one MCP server"):
        McpEnv(servers=[])


def test_the_guides_example_runs(tmp_path, monkeypatch):
    """docs/guides/mcp.md as written: its server and tasks file, and its command through
    ``jaxrl-eval`` (run from the folder that holds them): the oracle solves both tasks."""
    import re
    import shlex
    from pathlib import Path

    from jaxrl_agents.cli import eval as cli

    page = (Path(__file__).resolve().parents[2] / "docs/guides/mcp.md").read_text()
    [server] = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    [rows] = re.findall(r"^```json\n(.*?)^```", page, re.S | re.M)
    [command] = [
        b for b in re.findall(r"^```bash\n(.*?)^```", page, re.S | re.M) if "shop_tasks.jsonl" in b
    ]
    (tmp_path / "shop_server.py").write_text(server)
    (tmp_path / "shop_tasks.jsonl").write_text(rows)
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[0] == "jaxrl-eval"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [*argv, f"out={tmp_path / 'eval'}"])
    cli.main()
    data = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert data["meta"]["tasks"] == 2 and data["policies"]["scripted:oracle"]["success"] == 1.0
    assert not leftover("shop_server.py")
