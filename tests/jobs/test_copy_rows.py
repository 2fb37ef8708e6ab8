"""``trainer.sft.copy_steps``: the first SFT steps train on synthetic copy rows (random token
runs, each repeated), so a freshly initialised model learns to copy from its context before it
sees golden data. The rows, the key's checks, and the job through ``jaxrl-train``'s ``main()``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from train_cli import FAST
from train_cli import main_in_process as _main

from jaxrl_agents.chat.tokenizer import load_tiny_tokenizer
from jaxrl_agents.jobs.trainer_spec import SFTSpec
from jaxrl_agents.training.copy_rows import COPY_LEN, MIN_SPAN, copy_rows, ordinary_ids


def test_rows_train_only_on_the_copy():
    tok = load_tiny_tokenizer()
    vocab = ordinary_ids(tok)
    assert not set(vocab.tolist()) & (set(tok.all_special_ids) | set(tok.added_tokens_decoder))
    rows = copy_rows(np.random.default_rng(0), vocab, 200)
    spans, gaps = set(), set()
    for ids, mask in rows:
        assert len(ids) == len(mask) == COPY_LEN and set(ids) <= set(vocab.tolist())
        span = sum(mask) + 1  # the repeat's first token is not a target
        assert MIN_SPAN <= span <= COPY_LEN // 2 and mask[-(span - 1) :] == [1] * (span - 1)
        assert sum(mask[: COPY_LEN - span + 1]) == 0
        run = ids[-span:]  # the masked tokens end a run that appeared before, whole
        firsts = [i for i in range(COPY_LEN - 2 * span + 1) if ids[i : i + span] == run]
        assert firsts
        spans.add(span)
        gaps.add(COPY_LEN - span - firsts[0])
    assert len(spans) > 10  # run lengths vary
    # and so does the distance back to the first copy, at every run length but the longest:
    # a head keyed on position cannot predict the repeat
    assert len(gaps) > 20
    again = copy_rows(np.random.default_rng(0), vocab, 200)
    assert again == rows  # a step's rows come from its own seed: a resume draws the same


def test_bad_values_are_refused_by_name():
    with pytest.raises(ValueError, match="copy_steps=4 must be < steps=4"):
        SFTSpec(steps=4, copy_steps=4)
    with pytest.raises(ValueError, match="copy_steps=-1 must be >= 0"):
        SFTSpec(copy_steps=-1)
    with pytest.raises(ValueError, match="copy_batch=0 must be >= 1"):
        SFTSpec(copy_batch=0)
    with pytest.raises(ValueError, match="length=6: copy rows need at least 8"):
        copy_rows(np.random.default_rng(0), np.arange(7, 20), 1, length=6)


def test_job_runs_copy_steps_then_golden_data(tmp_path, monkeypatch, capsys):
    run = tmp_path / "copy"
    argv = [
        *FAST,
        f"run_dir={run}",
        "trainer.sft.copy_steps=2",
        "trainer.sft.copy_batch=4",
        "trainer.rl.steps=0",
    ]
    assert _main(argv, monkeypatch) == 0
    out = capsys.readouterr().out
    assert "SFT: steps 1-2 on synthetic copy rows (trainer.sft.copy_steps), then 2 on the" in out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("stage") == "sft"] == [4]
    assert json.loads((run / "config.json").read_text())["trainer"]["sft"]["copy_steps"] == 2


def test_copy_steps_hold_the_peak_lr_and_the_golden_steps_get_the_decay():
    from jaxrl_agents.training.step import OptimizerConfig

    lr = OptimizerConfig(lr=1.0, warmup_steps=2, hold_steps=3, decay_steps=4, min_lr_ratio=0.1)
    got = [float(lr.schedule()(k)) for k in range(10)]
    assert got[:2] == pytest.approx([1 / 3, 2 / 3])  # the warmup, as without a hold
    assert got[2:6] == pytest.approx([1.0] * 4)  # 3 held updates, then the decay's first
    assert got[6:] == pytest.approx(
        [0.1 + 0.9 * (1 + np.cos(np.pi * k / 4)) / 2 for k in (1, 2, 3, 4)]
    )
    plain = OptimizerConfig(lr=1.0, warmup_steps=2, decay_steps=4, min_lr_ratio=0.1).schedule()
    assert [float(plain(k)) for k in range(2, 7)] == pytest.approx(got[5:])
    with pytest.raises(ValueError, match="hold_steps=-1 must be >= 0"):
        OptimizerConfig(hold_steps=-1)
