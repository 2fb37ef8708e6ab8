"""``jaxrl-serve`` end to end: the real entry point in a subprocess, driven by the openai client;
start-up errors are one line naming the key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from jaxrl_agents.cli import serve as serve_cli

BIN = Path(sys.executable).with_name("jaxrl-serve")


def test_serves_the_tiny_model_to_an_openai_client_and_stops_on_sigterm(tmp_path):
    ready = tmp_path / "ready"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    argv = [str(BIN), "port=0", f"ready_file={ready}", "max_seconds=300", "model_name=demo"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), proc.communicate(timeout=30)
        client = openai.OpenAI(base_url=ready.read_text().strip(), api_key="-", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["demo"]
        # No episode key: plain inference, one request, nothing kept.
        out = client.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "What is 2+3?"}],
            max_tokens=6,
            temperature=0,
            logprobs=True,
        )
        choice = out.choices[0]
        # A turn cut by max_tokens holds exactly 6 tokens; a shorter one ended on a stop token.
        n = out.usage.completion_tokens
        if choice.finish_reason == "length":
            assert n == 6, (choice, n)
        else:
            assert choice.finish_reason == "stop" and 1 <= n <= 6, (choice, n)
        assert len(choice.logprobs.content) == out.usage.completion_tokens
        # An episode key the trainer never opened is a 404, not a new episode.
        with pytest.raises(openai.NotFoundError, match="unknown episode"):
            client.chat.completions.create(
                model="demo",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Episode-Id": "nope"},
            )
        with pytest.raises(openai.BadRequestError, match="limits.max_n=8"):
            client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], n=9
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert "serving demo at http://127.0.0.1:" in stdout
    assert "stopped; served" in stderr


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["host=0.0.0.0"], ["host='0.0.0.0'", "api_key"]),
        (["port=70000"], ["port=70000", "65535"]),
        (["limits.max_n=0"], ["max_n", "0"]),
        (["run=/nonexistent/run"], ["/nonexistent/run"]),
    ],
)
def test_start_up_errors_are_one_line(argv, needles, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["jaxrl-serve", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        serve_cli.main()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("config error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
