"""``trainer.sft.init_from``: RL recipes compared from one SFT result. A run started from another
run's SFT snapshot trains no SFT of its own, evaluates exactly the policy that run's SFT made (the
same held-out numbers, greedy), adds a fresh critic when its loss needs one, and refuses a source
whose SFT was made with other settings, naming them. Through ``jaxrl-train``'s ``main()``
in-process, as in ``train_cli``."""

from __future__ import annotations

import json

from train_cli import FAST
from train_cli import main_in_process as _main


def _stages(run):
    return json.loads((run / "stages.json").read_text())


def test_rl_from_another_runs_sft(tmp_path, monkeypatch, capsys):
    src, dst = tmp_path / "base", tmp_path / "gae"
    assert _main([*FAST, f"run_dir={src}"], monkeypatch) == 0
    capsys.readouterr()
    argv = [
        *FAST,
        f"run_dir={dst}",
        f"trainer.sft.init_from={src}",
        "advantage=gae",
        "loss=ppo_value",
        "model.scan_unroll=2",  # how the layers compile is not an SFT setting: accepted
        "+env.rl_options.fault_rate=0.5",  # the RL episodes' env: not an SFT setting either
    ]
    assert _main(argv, monkeypatch) == 0
    out = capsys.readouterr().out
    assert f"not trained here; the policy of {src}@sft" in out
    a, b = _stages(src), _stages(dst)
    assert b["sft_from"]["run"] == str(src.resolve()) and b["sft_from"]["sft_step"] == 4
    assert "sft_data" not in b  # no SFT data was made or trained on here
    # the same weights on the same held-out tasks, greedily: the same trajectories' numbers
    for key in ("success", "mean_total_tokens", "mean_generated_tokens", "mean_turns"):
        assert b["sft_eval"][key] == a["sft_eval"][key], key
    rows = [json.loads(x) for x in (dst / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r.get("stage") == "sft"]  # no SFT steps logged
    assert [r["step"] for r in rows if r.get("stage") == "rl"] == [1, 2]
    assert all(r["vf_loss"] > 0 for r in rows if r.get("stage") == "rl")  # the critic trains


def test_sft_from_refuses_other_sft_settings(tmp_path, monkeypatch, capsys):
    src = tmp_path / "base"
    assert _main([*FAST, f"run_dir={src}", "trainer.rl.steps=0"], monkeypatch) == 0
    for extra, needle in [
        (["trainer.sft.lr=0.002"], "trainer.sft.lr: 0.002 here, 0.001 there"),
        (["seed=3"], "seed: 3 here, 0 there"),
        (["env.oracle.premature_prob=0.5"], "env.oracle.premature_prob: 0.5 here, 0.9 there"),
    ]:
        argv = [*FAST, f"run_dir={tmp_path / 'x'}", f"trainer.sft.init_from={src}", *extra]
        code = _main(argv, monkeypatch)
        err = capsys.readouterr().err
        assert code not in (0, None), extra
        assert needle in err, err[-600:]
    argv = [*FAST, f"run_dir={tmp_path / 'y'}", f"trainer.sft.init_from={tmp_path / 'nothing'}"]
    assert _main(argv, monkeypatch) not in (0, None)
    assert "trainer.sft.init_from=" in capsys.readouterr().err
    assert not list(tmp_path.glob("[xy]/checkpoints"))  # stopped before anything was built


def test_rl_seed_reseeds_rl_alone(tmp_path, monkeypatch, capsys):
    """``trainer.rl.seed``: several RL seeds from one SFT result (``run_experiment.py
    --sft-seed``). Equal to the run's seed, RL draws exactly what the source run drew from the
    same SFT weights; another value draws other RL tasks and samples, while the model, the SFT
    result and the held-out tasks stay the seed's."""

    def rl_episodes(run):  # every RL step's sampled episodes: (task id, token ids)
        files = sorted((run / "trajectories").glob("samples_step*.jsonl"))
        rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
        return [(r["task"]["id"], r["token_ids"]) for r in rows]

    src = tmp_path / "base"
    assert _main([*FAST, f"run_dir={src}"], monkeypatch) == 0
    runs = {}
    for rl_seed in (0, 1):
        runs[rl_seed] = tmp_path / f"rl{rl_seed}"
        argv = [*FAST, f"run_dir={runs[rl_seed]}", f"trainer.sft.init_from={src}",
                f"trainer.rl.seed={rl_seed}"]  # fmt: skip
        assert _main(argv, monkeypatch) == 0
    capsys.readouterr()
    base = rl_episodes(src)
    assert len(base) == 8  # 2 RL steps of 2 tasks x 2 samples
    assert rl_episodes(runs[0]) == base  # rl_seed == seed: the source run's RL draws again
    other = rl_episodes(runs[1])
    assert len(other) == 8 and not {t for t, _ in other} & {t for t, _ in base}
    # the same SFT policy on the same held-out tasks
    assert _stages(runs[1])["sft_eval"] == _stages(src)["sft_eval"]
