"""SFT from the user's own data (``trainer.sft.data``): a JSONL file of OpenAI-style tool-calling
conversations, rendered through the policy's chat path, alone or mixed with the env oracle's
golden data; a malformed line stops the command before anything is compiled or written, in one
line naming the file, the line number and the problem.

The file is made the way a user would: the calculator env's oracle run through the real rollout
path and written with ``write_jsonl`` (the package's own trajectory records), plus hand-written
OpenAI-style conversations with JSON-string ``arguments``. Runs go through ``jaxrl-train``'s
``main()`` in-process, as in ``test_run_folders``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil

import numpy as np
import pytest
from train_cli import FAST
from train_cli import main_in_process as _main


def _hand_written(tools):
    """OpenAI-style conversations: string arguments, null content, tool_call_id, no tools."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": "12*7"})},
    }
    two = [
        {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": e})},
        }
        for k, e in ((2, "90-38"), (3, "52*2"))
    ]
    return [
        {
            "messages": [
                {"role": "user", "content": "What is 12 times 7?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "name": "calculator", "content": "84"},
                {"role": "assistant", "content": "84"},
            ],
            "tools": tools,
        },
        {
            "messages": [
                {
                    "role": "system",
                    "content": "Use the calculator tool. Reply with only the number.",
                },
                {
                    "role": "user",
                    "content": "Mia has 90 coins, gives away 38, then doubles the rest.",
                },
                {"role": "assistant", "content": "", "tool_calls": [two[0]]},
                {"role": "tool", "tool_call_id": "c2", "content": "52"},
                {"role": "assistant", "content": "", "tool_calls": [two[1]]},
                {"role": "tool", "tool_call_id": "c3", "content": "104"},
                {"role": "assistant", "content": "104"},
            ],
            "tools": tools,
        },
        {
            "messages": [
                {"role": "user", "content": "Say the number five."},
                {"role": "assistant", "content": "5"},
            ]
        },
    ]


@pytest.fixture(scope="module")
def chat():
    from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer

    return ChatFormat(load_tiny_tokenizer())


@pytest.fixture(scope="module")
def convs(tmp_path_factory, chat):
    """``(path, records)``: 20 oracle episodes (``write_jsonl``) + 3 hand-written conversations."""
    from jaxrl_agents.envs import ENVIRONMENTS
    from jaxrl_agents.envs.calculator import oracle_policy
    from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig
    from jaxrl_agents.rollout.scripted import ScriptedEngine
    from jaxrl_agents.types import EndReason, write_jsonl

    calc = ENVIRONMENTS["calculator"]
    orch = Orchestrator(
        engine=ScriptedEngine(chat, policy_factory=oracle_policy),
        chat=chat,
        env_factory=calc,
        cfg=RolloutConfig(group_size=1, max_turns=4, max_new_tokens=64, max_total_tokens=384),
        sampling_params=lambda n, seed: type("P", (), {"max_new_tokens": n, "seed": seed})(),
    )
    trajs = asyncio.run(orch.run(calc.make_tasks("train", 20, seed=11), group_size=1))
    assert len(trajs) == 20 and all(t.end_reason == EndReason.ANSWERED for t in trajs)
    path = tmp_path_factory.mktemp("data") / "convs.jsonl"
    write_jsonl(path, trajs)
    with open(path, "a") as f:
        for rec in _hand_written(trajs[0].tools):
            f.write(json.dumps(rec) + "\n")
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(records) == 23
    return path, records


def test_the_loader_encodes_each_record_through_the_chat_path(convs, chat):
    from jaxrl_agents.training.sft_data import load

    path, records = convs
    data = load(str(path), chat, max_positions=384)
    assert data.lines == list(range(1, 24))
    for rec, (ids, mask) in zip(records, data.rows, strict=True):
        enc = chat.encode_conversation(rec["messages"], rec.get("tools"))
        assert (ids, mask) == (enc.ids, enc.loss_mask)
        if "token_ids" in rec:  # a rollout's record: the ids the episode was sampled as
            assert (ids, mask) == (rec["token_ids"], rec["loss_mask"])
    # JSON-string arguments render exactly as dict ones
    hand = records[20]
    as_dicts = json.loads(json.dumps(hand))
    for m in as_dicts["messages"]:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    assert chat.encode_conversation(
        as_dicts["messages"], as_dicts["tools"]
    ) == chat.encode_conversation(hand["messages"], hand["tools"])


def _rows(run, stage):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == stage]


def test_sft_from_a_file_trains_on_exactly_its_rows(convs, chat, tmp_path, capsys, monkeypatch):
    from jaxrl_agents.rng import Keys

    path, records = convs
    run = tmp_path / "run"
    steps, batch = 30, 8  # trainer=smoke: sft_batch_size=8
    argv = [
        *FAST,
        f"run_dir={run}",
        f"trainer.sft.data={path}",
        "trainer.sft.oracle=false",
        f"trainer.sft.steps={steps}",
        "trainer.rl.steps=0",
    ]
    assert _main(argv, monkeypatch) == 0
    out = capsys.readouterr().out
    assert f"SFT data: 23 rows = 23 conversations from {path}" in out, out[-2000:]

    encoded = [chat.encode_conversation(r["messages"], r.get("tools")) for r in records]
    stages = json.loads((run / "stages.json").read_text())
    note = stages["sft_data"]
    assert note == {
        "rows": 23,
        "oracle_rows": 0,
        "file_rows": 23,
        "file": {
            "path": str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "conversations": 23,
            "tokens": sum(len(e.ids) for e in encoded),
            "assistant_tokens": sum(sum(e.loss_mask) for e in encoded),
        },
    }
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sft_data"] == note
    assert summary["sft_heldout_success"] is not None

    # Each logged step trained on the file's rows the SFT order draws (the pool is the file).
    sft = _rows(run, "sft")
    assert [r["step"] for r in sft] == [10, 20, 30]
    order = np.random.default_rng(Keys(0).seed("sft_order")).permutation(23)
    for r in sft:
        s = r["step"] - 1
        drawn = [order[(s * batch + j) % 23] for j in range(batch)]
        assert r["tokens"] == sum(sum(encoded[i].loss_mask) for i in drawn)
    nll = [r["nll"] for r in sft]
    assert all(math.isfinite(x) for x in nll) and nll[-1] < nll[0], nll


def test_file_and_oracle_data_are_mixed(convs, tmp_path, capsys, monkeypatch):
    path, _ = convs
    shutil.copy(path, tmp_path / "mine.jsonl")
    monkeypatch.chdir(tmp_path)  # a relative path resolves against the working directory
    argv = [*FAST, "run_dir=mixed", "trainer.sft.data=mine.jsonl", "trainer.rl.steps=0"]
    assert _main(argv, monkeypatch) == 0
    out = capsys.readouterr().out
    # trainer=smoke: 16 oracle episodes (all answered, premature guesses included)
    line = f"SFT data: 39 rows = 16 oracle episodes + 23 conversations from {tmp_path}/mine.jsonl"
    assert line in out, out[-2000:]
    note = json.loads((tmp_path / "mixed" / "stages.json").read_text())["sft_data"]
    assert (note["rows"], note["oracle_rows"], note["file_rows"]) == (39, 16, 23)
    assert note["file"]["path"] == str(tmp_path / "mine.jsonl")
    assert [r["step"] for r in _rows(tmp_path / "mixed", "sft")] == [4]


# -- malformed files ------------------------------------------------------------------------------

_U = {"role": "user", "content": "What is 2+2?"}
_A = {"role": "assistant", "content": "4"}


def _call(args):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": args}}
        ],
    }


BAD = [
    # (the bad line, needles of the error line)
    ('{"messages": [', ["not valid JSON"]),
    ("[1, 2]", ["not a JSON object"]),
    (json.dumps({"conversation": [_U, _A]}), ['no "messages" list']),
    (json.dumps({"messages": "hi"}), ['"messages" is not a list']),
    (
        json.dumps({"messages": [_U, {"role": "robot", "content": "x"}]}),
        ["messages[1] has an unknown role 'robot'", "system, user, assistant, tool"],
    ),
    (
        json.dumps({"messages": [{"role": "system", "content": "Be brief."}, _U]}),
        ["no assistant message"],
    ),
    (json.dumps({"messages": [_A, _U, _A]}), ["messages[0] is an assistant message"]),
    (
        json.dumps(
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, _A]}
        ),
        ["messages[0].content is not a string"],
    ),
    (
        json.dumps({"messages": [_U, _call("{expression: 2+2"), _A]}),
        ["messages[1].tool_calls[0].function.arguments is not a JSON object", "not JSON"],
    ),
    (
        json.dumps({"messages": [_U, _call("[1]"), _A]}),
        ["messages[1].tool_calls[0].function.arguments is not a JSON object"],
    ),
    (
        json.dumps(
            {
                "messages": [
                    _U,
                    {"role": "assistant", "tool_calls": [{"name": "calculator", "arguments": {}}]},
                    _A,
                ]
            }
        ),
        ['messages[1].tool_calls[0] has no "function" object'],
    ),
    (
        json.dumps({"messages": [_U, {"role": "assistant", "tool_calls": "calculator(2+2)"}]}),
        ["messages[1].tool_calls is not a list"],
    ),
    (
        json.dumps(
            {"messages": [_U, _call({"expression": "2+2"}), {"role": "tool", "content": 4}, _A]}
        ),
        ["messages[2].content is not a string"],
    ),
    (json.dumps({"messages": [_U, _A], "tools": {"calculator": {}}}), ['"tools" is not a list']),
    (
        json.dumps({"messages": [{"role": "user", "content": "seven plus eight " * 150}, _A]}),
        [
            "tokens",
            "longer than the largest training sequence bucket (384)",
            "rollout.max_total_tokens",
            "trainer.batching.seq_buckets",
        ],
    ),
]


def _one_line_error(argv, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    code = _main(argv, monkeypatch)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("config error: ") and "Traceback" not in err[0], err
    return err[0]


def _nothing_written(run):
    written = [p.name for p in run.glob("*") if p.name != ".hydra"] if run.exists() else []
    assert not [n for n in written if not n.endswith(".log")], written


_IDS = [
    "bad json",
    "not an object",
    "no messages",
    "messages not a list",
    "unknown role",
    "no assistant",
    "assistant first",
    "content parts",
    "arguments not json",
    "arguments a list",
    "call without function",
    "tool_calls not a list",
    "tool content a number",
    "tools not a list",
    "too long",
]


@pytest.mark.parametrize("bad, needles", BAD, ids=_IDS)
def test_a_malformed_line_is_one_error_line(bad, needles, tmp_path, capsys, monkeypatch):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"messages": [_U, _A]}) + "\n\n" + bad + "\n")  # bad: line 3
    run = tmp_path / "run"
    line = _one_line_error(
        [*FAST, f"run_dir={run}", f"trainer.sft.data={data}"], capsys, monkeypatch
    )
    assert f"trainer.sft.data={data}: line 3: " in line, line
    for needle in needles:
        assert needle in line, (needle, line)
    _nothing_written(run)


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["trainer.sft.data=nope.jsonl"], ["trainer.sft.data='nope.jsonl'", "no such file"]),
        (["trainer.sft.oracle=false"], ["trainer.sft.oracle=false", "trainer.sft.data=null"]),
    ],
    ids=["missing file", "no data"],
)
def test_missing_data_is_one_error_line(extra, needles, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line_error([*FAST, "run_dir=run", *extra], capsys, monkeypatch)
    for needle in needles:
        assert needle in line, (needle, line)
    if "nope" in extra[0]:
        assert str(tmp_path / "nope.jsonl") in line
    _nothing_written(tmp_path / "run")


def test_template_errors_and_further_bad_lines_are_named(tmp_path):
    from jaxrl_agents.chat import TINY_CHAT_TEMPLATE, ChatFormat, load_tiny_tokenizer
    from jaxrl_agents.training.sft_data import SftDataError, load

    strict = (
        "{%- for m in messages %}{%- if m.content == 'boom' %}"
        "{{ raise_exception('boom is not allowed here') }}{%- endif %}{%- endfor %}"
    ) + TINY_CHAT_TEMPLATE
    chat = ChatFormat(load_tiny_tokenizer(), chat_template=strict)
    data = tmp_path / "d.jsonl"
    boom = {"messages": [{"role": "user", "content": "boom"}, _A]}
    lines = [{"messages": [_U, _A]}, boom, {"messages": [_U]}, boom]
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(SftDataError) as e:
        load(str(data), chat, max_positions=384)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"trainer.sft.data={data}: line 2: the chat template cannot render it")
    assert "boom is not allowed here" in msg
    assert msg.endswith("(and 2 more bad line(s): 3, 4)"), msg
