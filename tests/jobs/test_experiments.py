"""Every ``experiment=<name>`` preset stays valid: composed through the CLI's config, built, its
oracle (with the annotator defect on) through the start-up checks (limits, chat round trip); and
its fast variant (``scripts/run_experiment.py <name> --quick``: 4 SFT and 2 RL steps) runs the
script's whole path, training, the side-by-side evaluation of SFT and RL, and the tables and
curves, with the script's commands run in-process (their compiled programs shared)."""

from __future__ import annotations

import importlib
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import run_experiment  # noqa: E402
from run_experiment import QUICK  # noqa: E402

PRESETS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))


def test_presets_exist():
    assert {"research", "travel", "sql"} <= set(PRESETS)


ENV = {"smollm2_calculator": "calculator", "research_3hop": "research", "padding": "calculator"}
"""Presets not named for their env (a model, a variant of another preset), with the env they
run."""
CLEAN_SFT = {"smollm2_calculator"}
"""Presets whose SFT data is the oracle's clean traces on a narrower task mix (``env.sft_tasks``,
``env.sft_options``) instead of an annotator with a habit."""


@pytest.mark.parametrize("name", PRESETS)
def test_preset_passes_the_start_up_checks(name):
    import asyncio

    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.system import build_train, check_oracle_fits

    own = to_run_config(compose("config", [f"experiment={name}"]))  # the preset's own values
    assert own.trainer.sft.copy_steps < own.trainer.sft.steps
    cfg = to_run_config(compose("config", [f"experiment={name}", "mesh=single", *QUICK]))
    assert cfg.name == f"exp_{name}" and cfg.env.name == ENV.get(name, name)
    rates = [v for k, v in cfg.env.oracle.items() if k.endswith("_prob")]
    if name in CLEAN_SFT:  # SFT lacks kinds of problems and faults instead of carrying a habit
        assert rates == [0.0] and cfg.env.sft_tasks and cfg.env.sft_options
    else:
        assert rates and all(v > 0 for v in rates)  # the annotator defect is on
    need = asyncio.run(check_oracle_fits(build_train(cfg)))
    assert need["turns"] <= cfg.rollout.max_turns


LIMITS = {
    "travel": ("rollout.max_turns=5", "rollout.max_new_tokens=160"),
    "sql": ("rollout.max_turns=5", "rollout.max_new_tokens=128"),
    "smollm2_calculator": (
        "model=tiny",
        "model.lora.rank=4",
        "rollout.max_new_tokens=32",
        "rollout.max_total_tokens=640",
        "sampler.max_seq_len=704",
        "trainer.batching.seq_buckets=[256,384,512,640]",
    ),
}
"""Four SFT steps leave a random policy that runs every episode to the limits: the script path
below runs under limits nearer what the oracle's episodes need (travel: 4 turns of up to ~150
tokens; sql: 4 of up to 113), which the job's own start-up check holds it to. The presets' own
limits are checked above. The real-model preset's script path runs on the tiny model (with
adapters, through the same Hermes template): SmolLM2's own steps are minutes on 2 cores, and
its start-up checks run above."""


VARIANT_OF = {"research_3hop": "research"}
"""Presets that set another preset's options only: its script path is that preset's (the
start-up checks above still run each on its own oracle and limits)."""
SAME_PATH = {**VARIANT_OF, "padding": "smollm2_calculator"}
"""Presets whose script path another preset's fast variant runs: ``padding`` is the demo's
calculator task on the tiny model, as the real-model preset's fast variant is, and its rewards'
path (``reward=dense`` from a shared SFT result) is sql's second run below."""


@pytest.mark.parametrize("name", [p for p in PRESETS if p not in SAME_PATH])
def test_fast_variant_runs_the_script_path(name, tmp_path, monkeypatch):
    seen = []

    def in_process(cmd, log):  # cmd: [python, -m, module, *args] as run_command would run it
        module, args = cmd[2], cmd[3:]
        seen.append((module, args))
        monkeypatch.setattr(sys, "argv", [module, *args])
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            importlib.import_module(module).main()
        except SystemExit as e:
            pytest.fail(f"{module} {' '.join(args)}: exit {e.code}")

    monkeypatch.chdir(tmp_path)  # Hydra's own output folders land here
    root = tmp_path / "experiments" / name
    # the suite's process simulates 8 devices; LIMITS: see there
    variant = " ".join(["mesh=single", *LIMITS.get(name, ())])
    result = run_experiment.train_and_eval(name, variant, 0, root, True, runner=in_process)
    for key in ("sft", "rl"):
        assert 0.0 <= result[key] <= 1.0, (key, result)
    # validation after SFT and after each of the 2 RL steps, against environment steps
    assert len(result["curve"]) == 3 and result["curve"][0][0] == 0.0
    assert result["curve"][-1][0] > 0
    run_dir = root / run_experiment.slug(variant) / "seed0"
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert len(report["policies"]) == 2  # SFT and RL side by side, on the same held-out tasks
    cfg = json.loads((run_dir / "config.json").read_text())
    # the evaluation keeps the run's own episode deadline, not jaxrl-eval's default
    eval_args = next(a for m, a in seen if m.endswith(".eval"))
    assert f"rollout.episode_timeout_s={cfg['rollout']['episode_timeout_s']}" in eval_args
    if cfg["env"]["tasks"].get("kinds"):  # the report's tasks come from the run's generator
        trajs = (run_dir / "eval").glob("trajectories_*.jsonl")
        kinds = {
            json.loads(x)["task"]["data"]["key"].split("/")[2]
            for f in trajs
            for x in f.read_text().splitlines()
        }
        assert kinds and kinds <= set(cfg["env"]["tasks"]["kinds"]), kinds
    text = run_experiment.write(name, [result], root)
    if cfg["env"]["name"] == "calculator":  # slices the env names: per seed, SFT and RL
        assert set(result["slices"]) == {"sft", "rl"}  # the tiny model: no zero-shot row
        assert "Held-out success by slice" in text and "| one-step | 0 |" in text
    assert "| 0 |" in text and "mean change (points)" in text
    b = result["behaviour"]  # held-out calls an episode before and after, RL's batches per step
    assert len(b["train_tool_calls"]) == 2 and b["rl"]["mean_tool_calls"] is not None
    assert "Behaviour: tool calls and turns" in text
    assert "one seed: no interval" in text and "nan" not in text
    assert f"Machine: {run_experiment.machine(result['environment'])}." in text
    assert result["environment"]["packages"]["jaxlib"] in text
    assert (root / "results.json").exists() and (root / "curves.png").stat().st_size > 0
    if name == "sql":  # --share-sft: a reward-design variant's RL from this run's SFT result
        other = run_experiment.train_and_eval(
            name, f"{variant} reward=dense", 0, root, True, runner=in_process, sft_from=run_dir
        )
        assert other["sft"] == result["sft"]  # the same SFT policy, evaluated again
        stages = json.loads((pathlib.Path(other["run_dir"]) / "stages.json").read_text())
        assert stages["sft_from"]["run"] == str(run_dir.resolve())
        assert "partial_credit" in stages["rl_eval"]["reward_terms"]


VARIANTS = [
    "advantage=turn_level loss=ppo_value",
    "a=1,2",
    "env.tasks.kinds=[city_range_orders]",
    "x={a: 'b'}",
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_folder_is_a_valid_hydra_value(variant):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    name = run_experiment.slug(variant)
    (o,) = OverridesParser.create().parse_overrides([f"run_dir=/tmp/exp/{name}/seed0"])
    assert o.value() == f"/tmp/exp/{name}/seed0" and name != "base"


def test_a_seed_stopped_at_the_rl_gate_counts_as_no_change(tmp_path):
    """A train command that stops at the RL gate (trainer.rl.start_min_success; the job's side is
    tests/jobs/test_rl_gate.py) fails as run_command's subprocess would; the script reports the
    seed as RL not run, counted as RL = SFT, and leaves it out of the curves."""
    gate = {"min_success": 0.05, "validation_success": 0.02, "passed": False}

    def stops_at_the_gate(cmd, log):
        run_dir = pathlib.Path(next(a for a in cmd if a.startswith("run_dir="))[8:])
        run_dir.mkdir(parents=True)
        sft = {"success": 0.05, "failure_modes": {"premature": 40}}
        (run_dir / "stages.json").write_text(json.dumps({"sft_eval": sft, "rl_gate": gate}))
        raise SystemExit("failed: jaxrl-train ...")

    def other_failure(cmd, log):
        raise SystemExit("failed: jaxrl-train ...")

    root = tmp_path / "experiments" / "sql"
    r = run_experiment.train_and_eval("sql", "", 1, root, False, runner=stops_at_the_gate)
    assert r["gate"] == gate and r["sft"] == r["rl"] == 0.05 and r["report"] is None
    with pytest.raises(SystemExit):  # any other failure still stops the script
        run_experiment.train_and_eval("sql", "x=1", 1, root, False, runner=other_failure)
    ok = {
        "variant": "base",
        "seed": 0,
        "sft": 0.5,
        "rl": 0.7,
        "wall_s": 1.0,
        "report": "r.html",
        "sft_failures": {"premature": 3},
        "rl_failures": {"premature": 1},
        "curve": [(0.0, 0.5), (10.0, 0.7)],
        "environment": {
            "cpu": "CPU A",
            "cpu_count": 2,
            "devices": "1 x cpu",
            "packages": {"jax": "0.10.2", "jaxlib": "0.10.2"},
        },
    }
    r["environment"] = {**ok["environment"], "cpu": "CPU B"}  # the gated seed ran elsewhere
    text = run_experiment.write("sql", [ok, r], root)
    assert (
        "Runs from different machines or builds (same config and seed can end elsewhere on "
        "another; `stages.json`'s `environment`): CPU A (2 CPUs; 1 x cpu), jax 0.10.2 / "
        "jaxlib 0.10.2; CPU B (2 CPUs; 1 x cpu), jax 0.10.2 / jaxlib 0.10.2."
    ) in text
    pinned = run_experiment.machine({**ok["environment"], "cpus_usable": 1})  # taskset -c 0
    assert pinned.startswith("CPU A (2 CPUs, 1 usable; 1 x cpu)"), pinned
    assert "| 1 | 0.050 | not run: SFT validation 0.020 < 0.05 | +0.0 | |" in text
    assert "| mean change (points) | +10.0 (-117.1 to +137.1) | | | |" in text  # +20 and 0
    assert "RL not run on seed(s) 1" in text and "| premature | 43 | 41 |" in text
    assert "[seed 0](r.html)" in text and "[seed 1]" not in text


def test_tables_compare_variants_with_t_intervals(tmp_path):
    def res(variant, seed, sft, rl):
        return {
            "variant": variant,
            "seed": seed,
            "sft": sft,
            "rl": rl,
            "wall_s": 1.0,
            "sft_failures": {"premature": 3},
            "rl_failures": {"premature": 1},
            "curve": [(0.0, sft), (10.0, rl)],
            "report": "r.html",
            "behaviour": {
                "sft": {"mean_turns": 2.0, "mean_tool_calls": 1.0},
                "rl": {"mean_turns": 3.0, "mean_tool_calls": 2.0 + seed},
                "train_tool_calls": [1.0] * 10 + [2.0, 3.0] * 5,
            },
        }

    results = [
        res("base", 0, 0.5, 0.6),
        res("base", 1, 0.4, 0.6),
        res("gigpo", 1, 0.4, 0.7),
        res("gigpo", 0, 0.5, 0.9),
        res("grpo", 2, 0.5, 0.9),
    ]
    text = run_experiment.write("sql", results, tmp_path)
    # base: changes +10 and +20 points, mean 15, t(1) = 12.706, sd 7.071 -> half-width 63.5
    assert "| base | 0 1 | 0.450 | 0.600 | +15.0 (-48.5 to +78.5) |  |" in text
    # gigpo minus base paired by seed: +10 (seed 1) and +30 (seed 0): mean 20, sd 14.14 -> 127.1
    assert (
        "| gigpo | 1 0 | 0.450 | 0.800 | +35.0 (-28.5 to +98.5) | +20.0 (-107.1 to +147.1) |"
        in text
    )
    assert "| grpo | 2 | 0.500 | 0.900 | +40.0 (one seed: no interval) | no common seed |" in text
    # the curves in numbers: point 1 of base is (10 env steps, 0.6 and 0.6): no spread
    assert "| base | 1 | 10 | 0.600 (0.600-0.600) |" in text
    assert "| gigpo | 1 | 10 | 0.800 (0.000-1.000) |" in text  # 0.7, 0.9: +-1.27, cut
    assert "| grpo | 0 | 0 | 0.500 (one seed: no interval) |" in text
    assert "| premature | 6 | 2 |" in text and (tmp_path / "curves.png").stat().st_size > 0
    # areas over the first 10 env steps: (SFT + RL) / 2 per seed; gigpo minus base by seed:
    # +0.15 (seed 0) and +0.05 (seed 1): mean 0.1, half-width 12.706 x 0.0707 / 1.414 = 0.635
    assert "| base | 0.550 / 0.500 | 0.525 (0.207-0.843) |  |" in text
    assert "| gigpo | 0.550 / 0.700 | 0.625 (-0.328-1.578) | +0.100 (-0.535 to +0.735) |" in text
    # behaviour: held-out calls and turns SFT -> RL; the RL batches' first 10 steps -> last 10
    assert "| gigpo | 1 | 1.00 -> 3.00 | 2.00 -> 3.00 | 1.00 -> 2.50 |" in text


def test_area_under_a_curve_is_cut_at_equal_env_steps():
    curve = [(0.0, 0.0), (10.0, 1.0), (20.0, 1.0)]
    assert run_experiment.area(curve, 10.0) == 0.5
    assert abs(run_experiment.area(curve, 15.0) - 10.0 / 15.0) < 1e-12  # 5 + 5, over 15
    assert abs(run_experiment.area([(0.0, 0.2), (4.0, 0.6)], 2.0) - 0.3) < 1e-12  # (0.2+0.4)/2


def fake_runs(monkeypatch) -> list[tuple[str, dict[str, str]]]:
    """The script's jobs replaced by a fake runner that records each command (module, overrides)
    and writes what a finished run leaves."""
    cmds = []

    def fake(cmd, log):
        args = dict(a.split("=", 1) for a in cmd[3:] if "=" in a and not a.startswith("policies"))
        cmds.append((cmd[2], args))
        if cmd[2].endswith("eval"):
            out = pathlib.Path(args["out"])
            out.mkdir(parents=True)
            (out / "report.json").write_text("{}")
            return
        run_dir = pathlib.Path(args["run_dir"])
        run_dir.mkdir(parents=True)
        cfg = {
            "seed": int(args["seed"]),
            "trainer": {"eval": {"heldout_tasks": 100}, "rl": {"tasks_per_step": 8}},
            "rollout": {
                "max_turns": 8,
                "max_new_tokens": 64,
                "max_total_tokens": 1280,
                "group_size": 4,
            },
            "sampler": {"max_seq_len": 1280, "max_slots": 32},
        }
        (run_dir / "config.json").write_text(json.dumps(cfg))
        (run_dir / "metrics.jsonl").write_text("")
        summary = {"sft_heldout_success": 0.5, "rl_heldout_success": 0.6}
        (run_dir / "summary.json").write_text(json.dumps(summary))

    real = run_experiment.train_and_eval
    monkeypatch.setattr(
        run_experiment, "train_and_eval", lambda *a, **k: real(*a, runner=fake, **k)
    )
    return cmds


def test_sft_seed_runs_every_rl_seed_from_one_sft(tmp_path, monkeypatch):
    """``--sft-seed S``: the first (variant, seed) trains SFT with seed=S; every other run starts
    RL from that folder's SFT result with its own ``trainer.rl.seed``, and is evaluated on the
    run's (seed S's) held-out tasks. The commands are recorded by a fake runner that writes what
    a finished run leaves."""
    cmds = fake_runs(monkeypatch)
    argv = [
        "run_experiment.py",
        "research",
        "--out",
        str(tmp_path),
        "--sft-seed",
        "2",
        "--seeds",
        "0",
        "1",
        "--variants",
        "",
        "advantage=gigpo",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    run_experiment.main()
    trains = [a for m, a in cmds if m.endswith("train")]
    evals = [a for m, a in cmds if m.endswith("eval")]
    first = tmp_path / "research" / "base" / "sft2-rl0"
    assert [(a["seed"], a["trainer.rl.seed"], a.get("trainer.sft.init_from")) for a in trains] == [
        ("2", "0", None),
        ("2", "1", str(first)),
        ("2", "0", str(first)),
        ("2", "1", str(first)),
    ]
    assert trains[3]["run_dir"] == str(tmp_path / "research" / "advantage-gigpo" / "sft2-rl1")
    assert {a["seed"] for a in evals} == {"2"}  # the run's held-out tasks, not the RL seed's
    text = (tmp_path / "research" / "results.md").read_text()
    assert "Seeds are RL seeds (`trainer.rl.seed`)" in text and "of seed 2" in text


def test_an_sft_baseline_variant_trains_its_own_sft(tmp_path, monkeypatch):
    """``--share-sft``: RL variants and RFT start from the first variant's SFT result; a recipe
    plus an SFT baseline's override (``R <mix>``) trains its own SFT on its own data."""
    cmds = fake_runs(monkeypatch)
    recipe, mix = "optimizer.lr=2e-4", run_experiment.BASELINES["mix"][0]
    rft = run_experiment.BASELINES["rft"][0]
    argv = ["run_experiment.py", "research", "--out", str(tmp_path), "--seeds", "0",
            "--share-sft", "--variants", "trainer.rl.steps=0", recipe, f"{recipe} {rft}",
            f"{recipe} {mix}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    run_experiment.main()
    first = str(tmp_path / "research" / "trainer.rl.steps-0" / "seed0")
    trains = [a for m, a in cmds if m.endswith("train")]
    assert [a.get("trainer.sft.init_from") for a in trains] == [None, first, first, None]
    assert trains[3]["env.sft_like_rl"] == "true" and trains[3]["trainer.rl.steps"] == "0"


def test_compile_cache_reaches_the_jobs(tmp_path, monkeypatch):
    """The script points its jobs at one persistent compilation cache (the environment carries it
    to every ``jaxrl-train`` / ``jaxrl-eval`` it starts), keeps a cache the user set, and uses
    none when given ''."""
    import os

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    assert run_experiment.use_compile_cache("") is None
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ
    where = run_experiment.use_compile_cache(str(tmp_path / "cache"))
    assert where == str((tmp_path / "cache").resolve()) == os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    # a cache the user chose wins over the script's
    assert run_experiment.use_compile_cache(str(tmp_path / "other")) == where
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == where


def test_equal_budget_gives_sft_baselines_the_rl_episodes():
    """An SFT-only baseline's data: the RL run's annotator episodes plus the episodes RL samples
    (15 x 8 x 4 = 480), each seen as often (batches of 8 after 600 copy steps)."""
    cfg = {
        "trainer": {
            "sft": {"steps": 1400, "copy_steps": 600, "examples": 6400},
            "rl": {"steps": 15, "tasks_per_step": 8},
        },
        "rollout": {"group_size": 4},
    }
    assert run_experiment.equal_budget(cfg) == [
        "trainer.sft.examples=6880",
        "trainer.sft.steps=1460",
        "trainer.rl.steps=0",
    ]
    # dynamic sampling: RL samples up to dynamic_max_rounds rounds a step; the baseline gets
    # the most (15 x 8 x 4 x 3 = 1440)
    cfg["trainer"]["rl"] |= {"dynamic_sampling": True, "dynamic_max_rounds": 3}
    assert run_experiment.equal_budget(cfg)[0] == "trainer.sft.examples=7840"
    # the research preset's own numbers, composed as the script composes them
    assert run_experiment.equal_budget(run_experiment.preset("research", []))[0] == (
        "trainer.sft.examples=6880"
    )


def test_baseline_table_pairs_rl_with_each_baseline(tmp_path):
    """``--baselines``: each method's final held-out success, RL minus it paired by seed, RL minus
    the baseline with the highest mean; ``--pass-k``: greedy, pass@1 and pass@k per seed."""

    def res(variant, seed, final, p1, p4, no_rl=True):
        return {
            "variant": variant,
            "seed": seed,
            "sft": 0.5,
            "rl": final,
            "no_rl": no_rl,
            "wall_s": 1.0,
            "sft_failures": {},
            "rl_failures": {},
            "curve": [],
            "report": None,
            "sampled": {"k": 4, "pass@1": p1, "pass@4": p4},
        }

    clean, rft = "env.oracle.premature_prob=0", "trainer.rl.stage=rft"
    results = [
        res("base", 3, 0.98, 0.9, 1.0, no_rl=False),
        res("base", 4, 0.94, 0.8, 1.0, no_rl=False),
        res(rft, 3, 0.70, 0.6, 0.9, no_rl=False),
        res(rft, 4, 0.60, 0.5, 0.8, no_rl=False),
        res(clean, 3, 0.96, 0.9, 1.0),
        res(clean, 4, 0.90, 0.7, 0.9),
    ]
    text = run_experiment.write("research", results, tmp_path)
    # RL - clean: +2 and +4 points: mean 3, sd 1.414, t(1) = 12.706 -> half-width 12.7
    assert (
        "| SFT on a clean annotator (`env.oracle.premature_prob=0`) | 0.96 (seed 3) / 0.90 "
        "(seed 4) | 0.930 (0.549-1.311) | +3.0 (-9.7 to +15.7; 2 seeds) |"
    ) in text
    assert "| +31.0 (-7.1 to +69.1; 2 seeds) |" in text  # RL - RFT: +28 and +34
    # the clean annotator has the higher mean (0.93 vs 0.65): the best baseline
    assert (
        "**RL minus the best non-RL baseline** (SFT on a clean annotator, the highest mean): "
        "**+3.0 points** (-9.7 to +15.7; 2 seeds, paired)."
    ) in text
    assert "| base | 3 | 0.980 | 0.900 | 1.000 |" in text
    assert "### RL against non-RL baselines" in text and "RL (the preset) |" in text
    # RFT from an RL recipe: the recipe plus the override is its baseline, the preset's is not
    recipe = "optimizer.lr=1e-4"
    results += [
        res(recipe, 3, 0.99, 0.9, 1.0, no_rl=False),
        res(recipe, 4, 0.97, 0.9, 1.0, no_rl=False),
        res(f"{recipe} {rft}", 3, 0.90, 0.8, 1.0, no_rl=False),
        res(f"{recipe} {rft}", 4, 0.80, 0.7, 0.9, no_rl=False),
    ]
    text = run_experiment.write("research", results, tmp_path)
    assert "### RL of `optimizer.lr=1e-4` against non-RL baselines" in text
    own = text[text.index("### RL of `optimizer.lr=1e-4`") :]
    assert (
        "| rejection-sampling fine-tuning from RL's starting policy (`trainer.rl.stage=rft`) | "
        "0.90 (seed 3) / 0.80 (seed 4) | 0.850 (0.215-1.485) | +13.0 (-37.8 to +63.8; 2 seeds) |"
    ) in own  # +9 and +17 points
    assert "SFT on a clean annotator" not in own.split("\n\n**RL minus")[0]
    assert "| base | mean (95% t) | 0.960 (0.706-1.214) | 0.850 (0.215-1.485) |" in text
    assert f"### {clean}\n\n| seed | SFT | final (no stage after SFT) | change | wall |" in text
    # an SFT baseline of RL's mix given as a variant: the recipe's too, and now its best
    mix = run_experiment.BASELINES["mix"][0]
    results += [
        res(f"{recipe} {mix}", 3, 0.95, 0.9, 1.0),
        res(f"{recipe} {mix}", 4, 0.91, 0.9, 1.0),
    ]
    own = run_experiment.write("research", results, tmp_path).split("### RL of `optimizer")[1]
    assert (
        f"| SFT on a clean annotator of RL's task mix and env (`{mix}`) | 0.95 (seed 3) / 0.91 "
        "(seed 4) | 0.930 (0.676-1.184) | +5.0 (-7.7 to +17.7; 2 seeds) |"
    ) in own  # +4 and +6 points
    assert "(SFT on a clean annotator of RL's task mix and env, the highest mean): **+5.0" in own


def test_preset_variants_build_on_the_preset_they_name():
    import yaml

    for name, base in VARIANT_OF.items():
        cfg = yaml.safe_load((ROOT / "configs" / "experiment" / f"{name}.yaml").read_text())
        assert cfg["defaults"][0] == base, (name, cfg["defaults"])


def test_an_evaluation_past_its_episode_deadline_is_named(tmp_path, capsys):
    report = {"policies": {"seed2@sft": {"failure_modes": {"episode_timeout": 0}},
                           "seed2@latest": {"failure_modes": {"episode_timeout": 64}}}}  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert run_experiment.warn_timeouts(tmp_path) == 64
    out = capsys.readouterr().out
    assert "seed2@latest 64" in out and "seed2@sft" not in out and "episode_timeout_s" in out
    assert run_experiment.warn_timeouts(tmp_path / "missing") == 0
    assert run_experiment.episode_deadline({"rollout": {"episode_timeout_s": 1200.0}}) == [
        "rollout.episode_timeout_s=1200.0"
    ]


def test_a_run_killed_by_a_signal_says_which_and_what_to_do(tmp_path):
    """A job the kernel's out-of-memory killer stops exits with -9 and often no message of its
    own: the script's failure names the signal and the likely cause, not only the log's tail."""
    cmd = [sys.executable, "-c", "import os, signal; print('step 3'); os.kill(os.getpid(), 9)"]
    with pytest.raises(SystemExit) as e:
        run_experiment.run_command(cmd, tmp_path / "train_console.log")
    text = str(e.value)
    assert "step 3" in text and "killed by SIGKILL" in text and "out-of-memory killer" in text
    term = [sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"]
    with pytest.raises(SystemExit) as e:
        run_experiment.run_command(term, tmp_path / "term.log")
    assert "killed by SIGTERM" in str(e.value) and "out-of-memory" not in str(e.value)
    with pytest.raises(SystemExit) as e:  # an ordinary failure: the log's tail only
        run_experiment.run_command([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "x")
    assert "killed" not in str(e.value)


def test_each_job_reports_its_own_peak_memory(tmp_path):
    """The line a finished job prints names its own peak RSS (what --jobs must fit in memory),
    measured for that child alone: a 900 MiB job after a 50 MiB one reports each its own. The
    floor is the parent's own peak (a child runs in its parent's memory until it execs), so the
    parent here is the script in a fresh interpreter, as in use, not this test's process."""
    jobs = [[sys.executable, "-c", f"b = bytearray({mib} << 20); b[::4096] = b'x' * {mib << 8}"]
            for mib in (900, 50)]  # fmt: skip
    parent = tmp_path / "parent.py"
    parent.write_text(
        f"import pathlib, sys\nsys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "import run_experiment\n"
        f"for i, cmd in enumerate({jobs!r}):\n"
        f"    run_experiment.run_command(cmd, pathlib.Path({str(tmp_path)!r}) / f'{{i}}.log')\n"
    )
    out = subprocess.run([sys.executable, parent], capture_output=True, text=True, check=True)
    big, small = (float(m) for m in re.findall(r"peak RSS ([\d.]+) GiB", out.stdout))
    assert 0.85 <= big <= 1.1 and small <= 0.15
