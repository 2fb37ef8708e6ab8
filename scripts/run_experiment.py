"""Run an ``experiment=<name>`` preset over seeds (and variants), then write its tables and curves.

    python scripts/run_experiment.py research                       # seeds 0 1 2
    python scripts/run_experiment.py research --seeds 0 --quick     # a few steps (smoke)
    python scripts/run_experiment.py research --variants advantage=grpo advantage=gigpo \\
        "advantage=turn_level loss=ppo_value"                        # credit assignment
    python scripts/run_experiment.py research --variants reward=dense reward=demo
    python scripts/run_experiment.py sql --share-sft --variants "" advantage=grpo  # one SFT a seed
    python scripts/run_experiment.py research --sft-seed 2 --seeds 2 0 1 --variants "" \
        advantage=grpo        # one SFT in all; --seeds are RL seeds (trainer.rl.seed)

Each (variant, seed) trains with ``jaxrl-train experiment=<name> seed=<s> <variant>`` in its own
run folder ``experiments/<name>/<variant>/seed<s>`` (a rerun resumes it), then ``jaxrl-eval`` puts
the SFT and the final RL policy side by side on the same held-out tasks (flipped tasks both ways,
with both trajectories) in ``.../eval/``. The script writes ``experiments/<name>/results.md``
(every seed's held-out success for SFT and RL, the mean with a 95% t-interval over seeds, and the
failure taxonomy summed over seeds before and after; the learning curves in numbers; with several
variants, each one's RL minus the first variant's, paired by seed), ``results.json`` and
``curves.png`` (validation success against environment steps, mean and 95% t-interval over seeds,
one line per variant).

``--baselines`` runs RL against the non-RL baselines at an equal episode budget (``BASELINES``)
and adds RL minus the best of them, paired by seed; a variant that is another variant plus a
baseline's override is that variant's baseline, paired the same way (RFT from an RL recipe:
``--variants R "R trainer.rl.stage=rft"``, at the recipe's budget; an SFT baseline so given
trains its own SFT under ``--share-sft``, on the SFT stage's budget); ``--pass-k K`` adds a
sampled evaluation of every final policy (K samples a task at the run's temperature: pass@1 and
pass@K); ``--set`` applies overrides to every run (e.g. a task pool never looked at);
``--jobs N`` runs N (variant, seed) runs at once (a run that starts from another's SFT result
waits for it), with ``--eval-jobs`` (default 1) of their evaluations at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

QUICK = ["trainer.sft.steps=4", "trainer.sft.copy_steps=0", "trainer.sft.examples=16",
         "trainer.sft.batch_size=4",
         "trainer.rl.steps=2", "trainer.rl.tasks_per_step=2", "rollout.group_size=2",
         "trainer.eval.every=1", "trainer.eval.heldout_tasks=4", "trainer.eval.validation_tasks=4",
         "trainer.checkpoint.every=1", "trainer.checkpoint.async_save=false",
         "trainer.log.progress=false", "trainer.checkpoint.export=false", "sampler.max_slots=16",
         "trainer.rl.start_min_success=0"]  # fmt: skip
"""A few steps of every stage; 4 SFT steps solve nothing, so the RL gate is off. No copy steps
(a preset's ``trainer.sft.copy_steps``): their path is tested on its own (tests/jobs/
test_copy_rows.py), and the suite does not compile their program once per preset."""
BASELINES = {
    "rft": ("trainer.rl.stage=rft", "rejection-sampling fine-tuning from RL's starting policy"),
    "verified": (
        "trainer.sft.filter=verified",
        "SFT on the annotator's data filtered by the env's verdict",
    ),
    "clean": ("env.oracle.premature_prob=0", "SFT on a clean annotator"),
    "mix": (
        "env.oracle.premature_prob=0 env.sft_like_rl=true trainer.rl.steps=0",
        "SFT on a clean annotator of RL's task mix and env",
    ),
}
"""``--baselines``: ``{name: (override, what it is)}`` of the non-RL baselines run beside the
preset (SFT, then RL). RFT starts from the RL
run's SFT result (the same SFT, then the RL stage's episode budget sampled, verified and
fine-tuned on); each SFT baseline trains its own SFT with no stage after it
(``trainer.rl.steps=0``) on as many annotator episodes as the RL run's SFT data plus its RL
episodes (:func:`equal_budget`)."""
EVAL_GATE = threading.BoundedSemaphore(1)
"""How many ``jaxrl-eval`` jobs run at once across ``--jobs`` (``--eval-jobs``): an evaluation
holds every policy it compares (a pretrained model's three take ~10 GB), so evaluations that
finish together can outgrow the memory their training runs fitted in."""
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def slug(variant: str) -> str:
    """A variant's folder name, also a valid Hydra override value (no ``=``, ``,``, space or
    bracket):
    ``"advantage=turn_level loss=ppo_value"`` -> ``advantage-turn_level+loss-ppo_value``."""
    name = "+".join(variant.split()).replace("=", "-").replace("/", "-")
    return re.sub(r"[^\w.+-]", "_", name) or "base"  # also no brackets, quotes or braces


def preset(name: str, overrides: list[str]) -> dict:
    """The composed config of ``experiment=<name>`` with ``overrides``."""
    from omegaconf import OmegaConf

    from jaxrl_agents.cli.app import compose

    return OmegaConf.to_container(compose("config", [f"experiment={name}", *overrides]),
                                  resolve=True)  # fmt: skip


def equal_budget(cfg: dict) -> list[str]:
    """Overrides that give an SFT-only baseline the RL run's episode budget: its SFT data are
    the RL run's annotator episodes plus as many as RL samples (``steps x tasks_per_step x
    group_size``; with dynamic sampling, x ``dynamic_max_rounds``: the most it samples), and its
    golden steps grow so that each episode is still seen as often (the copy steps unchanged); no
    stage after SFT."""
    sft, rl = cfg["trainer"]["sft"], cfg["trainer"]["rl"]
    rounds = rl["dynamic_max_rounds"] if rl.get("dynamic_sampling") else 1  # RL's most
    extra = rl["steps"] * rl["tasks_per_step"] * cfg["rollout"]["group_size"] * rounds
    golden = sft["steps"] - sft["copy_steps"]
    per_step = sft["examples"] / golden  # episodes per golden step
    steps = sft["copy_steps"] + round((sft["examples"] + extra) / per_step)
    return [f"trainer.sft.examples={sft['examples'] + extra}", f"trainer.sft.steps={steps}",
            "trainer.rl.steps=0"]  # fmt: skip


def run_command(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    t = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ,
                             "PYTHONUNBUFFERED": "1"})  # fmt: skip
        # wait4: this child's own peak RSS, not the largest over all children (its floor is
        # this script's own peak: a child runs in its parent's memory until it execs)
        _, status, usage = os.wait4(p.pid, 0)
    rc = p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell the Popen
    peak = usage.ru_maxrss * 1024 / 2**30  # Linux reports KiB
    print(f"  {' '.join(cmd[3:])}: rc {rc} in {time.time() - t:.0f} s, peak RSS {peak:.1f} GiB "
          f"(log {log})")  # fmt: skip
    if rc:
        tail = log.read_text().splitlines()[-5:]
        raise SystemExit(f"failed: {' '.join(cmd)}\n" + "\n".join([*tail, *killed(rc)]))


def killed(rc: int) -> list[str]:
    """What a negative return code (the job killed by a signal) says, and what to do."""
    if rc >= 0:
        return []
    name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
    why = [f"killed by {name}"]
    if -rc == signal.SIGKILL:  # what the kernel's out-of-memory killer sends
        why.append(
            "  SIGKILL with no one stopping it is usually the out-of-memory killer (dmesg says "
            "which process): rerun with fewer --jobs; the run resumes from its last checkpoint "
            "(trainer.checkpoint.every)"
        )
    return why


def use_compile_cache(folder: str | None) -> str | None:
    """Point the jobs this script starts at JAX's persistent compilation cache in ``folder`` (the
    environment carries it to them): a seed after the first, a variant and a resumed run load
    their programs instead of compiling them again. The compiled programs are the same, so the
    results are too. A ``JAX_COMPILATION_CACHE_DIR`` already set wins; ``folder`` None or empty:
    no cache. Returns the folder in use."""
    have = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if have or not folder:
        return have or None
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(Path(folder).resolve())
    # the tiny model's programs compile in well under JAX's default 1 s threshold
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    return os.environ["JAX_COMPILATION_CACHE_DIR"]


def run_folder(root: Path, variant: str, seed: int, sft_seed: int | None = None) -> Path:
    """A (variant, seed)'s run folder: ``<root>/<variant>/seed<seed>``, or with one SFT result
    for every run (``--sft-seed``) ``<root>/<variant>/sft<sft_seed>-rl<seed>``."""
    leaf = f"seed{seed}" if sft_seed is None else f"sft{sft_seed}-rl{seed}"
    return root / slug(variant) / leaf


def train_and_eval(
    name: str,
    variant: str,
    seed: int,
    root: Path,
    quick: bool,
    runner=None,
    sft_from: Path | None = None,
    sft_seed: int | None = None,
    extra: list[str] | tuple[str, ...] = (),
    pass_k: int | None = None,
) -> dict:
    """Train (unless the run folder is finished) and evaluate one (variant, seed); ``runner(cmd,
    log)`` runs a ``python -m <module> ...`` command (default :func:`run_command`, a subprocess);
    ``sft_from``: a run folder whose SFT result RL starts from (``trainer.sft.init_from``);
    ``sft_seed``: the run's seed is ``sft_seed`` and ``seed`` is its RL seed alone
    (``trainer.rl.seed``; folder ``sft<sft_seed>-rl<seed>``); ``extra``: overrides after the
    variant's that do not name its folder (``--set``, a baseline's budget); ``pass_k``: also
    sample the final policy ``pass_k`` times a task (pass@1 and pass@k, in ``eval_pass<k>/``)."""
    run = runner or run_command
    run_dir = run_folder(root, variant, seed, sft_seed)
    seeds = (
        [f"seed={seed}"] if sft_seed is None else [f"seed={sft_seed}", f"trainer.rl.seed={seed}"]
    )
    py = [sys.executable, "-m"]
    # a variant's overrides come last: they may override QUICK's too
    overrides = [f"experiment={name}", *seeds, f"run_dir={run_dir}",
                 *(QUICK if quick else []), *variant.split(), *extra]  # fmt: skip
    if sft_from is not None:
        overrides.append(f"trainer.sft.init_from={sft_from}")
    if not (run_dir / "summary.json").exists():
        try:
            run([*py, "jaxrl_agents.cli.train", *overrides], run_dir / "train_console.log")
        except SystemExit:  # stopped at the RL gate (a rerun stops there again), or a failure
            result = gated_result(name, variant, seed, run_dir, sft_seed)
            if result is None:
                raise
            return result
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    out = run_dir / "eval"
    # a pretrained checkpoint (model.path) is also evaluated as it is: the zero-shot row
    base = cfg.get("model", {}).get("path")
    if not (out / "report.json").exists():
        # no env=: jaxrl-eval takes the run's own env (its task generator, options, oracle), so
        # the report's held-out tasks are the ones the run was evaluated on
        policies = ",".join([f"{run_dir}@sft", f"{run_dir}@latest", *([base] if base else [])])
        template = cfg.get("chat", {}).get("template")
        ev = [f"policies=[{policies}]", f"out={out}",
              *([f"chat.template={template}"] if template and base else []),
              f"tasks={cfg['trainer']['eval']['heldout_tasks']}", f"seed={cfg['seed']}",
              *run_limits(cfg)]  # fmt: skip
        with EVAL_GATE:
            run([*py, "jaxrl_agents.cli.eval", *ev], run_dir / "eval_console.log")
    warn_timeouts(out)
    sampled = None
    if pass_k:
        sampled = sampled_eval(cfg, run_dir, pass_k, run, py)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    env_steps, curve = 0.0, []
    sft_val = summary.get("sft_validation_success")
    if sft_val is not None:
        curve.append((0.0, sft_val))
    for r in rows:
        if r["stage"] == "rl":
            n_eps = cfg["trainer"]["rl"]["tasks_per_step"] * cfg["rollout"]["group_size"]
            env_steps += r.get("mean_turns", 0.0) * n_eps
        elif r["stage"] == "eval" and "validation_success" in r and r["step"] > 0:
            curve.append((env_steps, r["validation_success"]))
    final = summary.get("rl_validation_success")  # the last step's is in the summary only
    if final is not None and env_steps > 0 and (not curve or curve[-1][0] < env_steps):
        curve.append((env_steps, final))
    report = json.loads((out / "report.json").read_text()).get("policies", {})
    named = dict(zip(("sft", "rl", "zero_shot"), report.values(), strict=False))
    slices = {k: m.get("slices", {}) for k, m in named.items() if m.get("slices")}
    return {
        "variant": variant or "base", "seed": seed, "sft_seed": sft_seed,
        "run_dir": str(run_dir),
        "sft": summary["sft_heldout_success"], "rl": summary["rl_heldout_success"],
        "zero_shot": named["zero_shot"]["success"] if "zero_shot" in named else None,
        "slices": slices,
        "sft_failures": (summary.get("sft") or {}).get("failure_modes", {}),
        "rl_failures": (summary.get("rl") or {}).get("failure_modes", {}),
        "wall_s": summary.get("wall_s"), "curve": curve,
        "report": str(out / "report.html"), "environment": summary.get("environment"),
        "sampled": sampled, "no_rl": cfg["trainer"]["rl"].get("steps") == 0,
        "behaviour": behaviour(summary, rows),
    }  # fmt: skip


def run_limits(cfg: dict) -> list[str]:
    """The run's own episode limits (turns, tokens, deadline) and sampler size (cache length,
    slots) as jaxrl-eval overrides, so an evaluation plays the episodes the run trained on in
    the memory the run already showed it has (jaxrl-eval's default 64 slots double a 32-slot
    run's KV cache: ~3.4 GB for SmolLM2 at 1152 tokens)."""
    ro = cfg["rollout"]
    return [f"rollout.max_turns={ro['max_turns']}",
            f"rollout.max_new_tokens={ro['max_new_tokens']}",
            f"rollout.max_total_tokens={ro['max_total_tokens']}", *episode_deadline(cfg),
            f"sampler.max_seq_len={cfg['sampler']['max_seq_len']}",
            f"sampler.max_slots={cfg['sampler']['max_slots']}"]  # fmt: skip


def episode_deadline(cfg: dict) -> list[str]:
    """The run's own episode deadline for its evaluation (a real model's preset raises it:
    jaxrl-eval's default, meant for the tiny model, cuts a 135M model's episodes on a busy CPU
    and counts them as failures)."""
    t = cfg.get("rollout", {}).get("episode_timeout_s")
    return [f"rollout.episode_timeout_s={t}"] if t is not None else []


def warn_timeouts(out: Path) -> int:
    """Say when an evaluation's episodes hit their deadline: such an episode counts as a
    failure, so its policy's success there measures the machine's load, not the policy."""
    report = out / "report.json"
    if not report.exists():
        return 0
    policies = json.loads(report.read_text()).get("policies", {})
    hit = {n: m.get("failure_modes", {}).get("episode_timeout", 0) for n, m in policies.items()}
    hit = {n: c for n, c in hit.items() if c}
    if hit:
        print(f"WARNING {out}: episodes past rollout.episode_timeout_s (counted as failures): "
              + ", ".join(f"{n} {c}" for n, c in hit.items())
              + "; delete the folder and rerun on a quieter machine or a longer deadline",
              flush=True)  # fmt: skip
    return sum(hit.values())


def behaviour(summary: dict, rows: list[dict]) -> dict:
    """What the policies do, not only whether they succeed: held-out turns and tool calls an
    episode of the SFT and the final policy, and the sampled episodes' tool calls an episode at
    each RL step (``metrics.jsonl``): padding, loops and skipped calls show here first."""
    held = {k: {f: (summary.get(k) or {}).get(f) for f in ("mean_turns", "mean_tool_calls")}
            for k in ("sft", "rl")}  # fmt: skip
    train = [r["mean_tool_calls"] for r in rows if r["stage"] == "rl" and "mean_tool_calls" in r]
    return {**held, "train_tool_calls": train}


def sampled_eval(cfg: dict, run_dir: Path, k: int, run, py: list[str]) -> dict:
    """pass@1 and pass@k of the run's final policy on its held-out tasks: ``k`` samples a task at
    the run's own sampling settings (``rollout.sampling``), in ``<run>/eval_pass<k>/``."""
    out = run_dir / f"eval_pass{k}"
    if not (out / "report.json").exists():
        ro = cfg["rollout"]
        sampling = [f"rollout.sampling.{f}={v}" for f, v in ro["sampling"].items()]
        ev = [f"policies=[{run_dir}@latest]", f"out={out}", f"samples={k}", f"ks=[1,{k}]",
              f"tasks={cfg['trainer']['eval']['heldout_tasks']}", f"seed={cfg['seed']}",
              *run_limits(cfg), *sampling]  # fmt: skip
        with EVAL_GATE:
            run([*py, "jaxrl_agents.cli.eval", *ev], run_dir / f"eval_pass{k}_console.log")
    warn_timeouts(out)
    m = next(iter(json.loads((out / "report.json").read_text())["policies"].values()))
    return {"k": k, "pass@1": m["pass@1"], f"pass@{k}": m[f"pass@{k}"]}


def gated_result(
    name: str, variant: str, seed: int, run_dir: Path, sft_seed: int | None = None
) -> dict | None:
    """A (variant, seed) that stopped at the RL gate (its SFT policy's validation success below
    ``trainer.rl.start_min_success``; ``stages.json``'s ``rl_gate``), None if it did not. Its
    final policy is the SFT policy, so its RL numbers are the SFT's (a change of 0 in the means;
    the tables say so) and it has no curve."""
    path = run_dir / "stages.json"
    stages = json.loads(path.read_text()) if path.exists() else {}
    gate = stages.get("rl_gate")
    if gate is None or gate["passed"]:
        return None
    sft = stages["sft_eval"]
    print(f"  {name} [{variant or 'base'}] seed {seed}: RL not run (SFT validation success "
          f"{gate['validation_success']:.3f} < trainer.rl.start_min_success="
          f"{gate['min_success']}); counted as RL = SFT")  # fmt: skip
    fails = sft.get("failure_modes", {})
    return {
        "variant": variant or "base", "seed": seed, "sft_seed": sft_seed,
        "run_dir": str(run_dir), "sft": sft["success"], "rl": sft["success"], "gate": gate,
        "sft_failures": fails, "rl_failures": fails, "wall_s": None, "curve": [], "report": None,
        "environment": stages.get("environment"),
    }  # fmt: skip


def interval(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def span(lo: float, hi: float, fmt: str = ".3f", sep: str = "-") -> str:
    """An interval's text; one seed has none (``interval`` gives NaN bounds)."""
    if math.isnan(lo):
        return "one seed: no interval"
    return f"{lo:{fmt}}{sep}{hi:{fmt}}"


def machine(env: dict) -> str:
    """One line for a run's ``environment`` (``stages.json``)."""
    pk = env.get("packages", {})
    usable = env.get("cpus_usable")
    cpus = f"{env.get('cpu_count')} CPUs" + (
        f", {usable} usable" if usable not in (None, env.get("cpu_count")) else ""
    )
    return (f"{env.get('cpu')} ({cpus}; {env.get('devices')}), "
            f"jax {pk.get('jax')} / jaxlib {pk.get('jaxlib')}"
            + (f", XLA_FLAGS={env['xla_flags']!r}" if env.get("xla_flags") else ""))  # fmt: skip


def learning_curves(results: list[dict]) -> dict[str, list[tuple[float, float, float, float]]]:
    """Per variant, ``(env steps, mean, lo, hi)`` of validation success at each evaluation point
    over its seeds (95% t-interval cut to [0, 1]; NaN bounds for one seed), cut to the shortest
    seed's curve; gated seeds (no curve) are left out."""
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in results):
        cs = [r["curve"] for r in results if r["variant"] == variant and r["curve"]]
        n = min(len(c) for c in cs) if cs else 0
        if n:
            pts = [(statistics.mean(c[i][0] for c in cs), *interval([c[i][1] for c in cs]))
                   for i in range(n)]  # fmt: skip
            # a success rate's interval ends inside [0, 1] (one seed: NaN, no interval)
            cut = [(x, m, max(lo, 0.0), min(hi, 1.0)) for x, m, lo, hi in pts]
            out[variant] = pts if math.isnan(pts[0][2]) else cut
    return out


def area(curve: list[tuple[float, float]], upto: float) -> float:
    """Mean validation success over the first ``upto`` environment steps: the area under the
    piecewise-linear curve ``(env steps, success)`` from its first point to ``upto``, over
    ``upto``."""
    total = 0.0
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 >= upto:
            break
        if x1 > upto:  # cut the segment at upto
            y1, x1 = y0 + (y1 - y0) * (upto - x0) / (x1 - x0), upto
        total += (x1 - x0) * (y0 + y1) / 2
    return total / upto


def area_table(by_variant: dict[str, list[dict]]) -> list[str]:
    """Each variant's area under its validation curve per seed at equal environment steps (the
    fewest any run reached), the mean with a 95% t-interval, and minus the first variant's,
    paired by seed: credit assignment compared by how fast each recipe learns, not only where
    it ends. Empty with fewer than two variants with curves."""
    runs = {v: [r for r in rs if len(r["curve"]) > 1] for v, rs in by_variant.items()}
    runs = {v: rs for v, rs in runs.items() if rs}
    if len(runs) < 2:
        return []
    upto = min(r["curve"][-1][0] for rs in runs.values() for r in rs)
    first = next(iter(runs))
    ref = {r["seed"]: area(r["curve"], upto) for r in runs[first]}
    lines = [f"Area under the validation curve over the first {upto:.0f} environment steps "
             "(mean validation success over them; every run reached that many):", "",
             "| variant | per seed | mean (95% t-interval) | minus "
             f"{first}'s, paired by seed (95% t-interval) |", "|---|---|---|---|"]  # fmt: skip
    for variant, rs in runs.items():
        a = [area(r["curve"], upto) for r in rs]
        m, lo, hi = interval(a)
        diffs = [x - ref[r["seed"]] for x, r in zip(a, rs, strict=True) if r["seed"] in ref]
        paired = ""
        if variant != first and diffs:
            d, dlo, dhi = interval(diffs)
            paired = f"{d:+.3f} ({span(dlo, dhi, '+.3f', ' to ')})"
        per = " / ".join(f"{x:.3f}" for x in a)
        lines.append(f"| {variant} | {per} | {m:.3f} ({span(lo, hi)}) | {paired} |")
    return [*lines, ""]


def slice_table(rs: list[dict]) -> list[str]:
    """Held-out success per env-named slice (``Ann.SLICES``: e.g. one-step, two-step, fault-hit)
    for each seed, zero-shot / SFT / RL with 95% Wilson intervals, and per slice the mean of
    RL minus SFT over seeds (95% t-interval). Empty when the env names no slices."""
    with_slices = [r for r in rs if r.get("slices")]
    if not with_slices:
        return []
    names = sorted({k for r in with_slices for m in r["slices"].values() for k in m})
    zero = any("zero_shot" in r["slices"] for r in with_slices)
    cols = ["zero-shot"] * zero + ["SFT", "RL"]
    lines = ["| slice | seed | " + " | ".join(cols) + " | RL - SFT (points) |",
             "|---|---|" + "---|" * (len(cols) + 1)]  # fmt: skip

    def cell(m: dict | None) -> str:
        if not m:
            return "-"
        lo, hi = m["ci95"]
        return f"{m['success']:.2f} ({lo:.2f}-{hi:.2f}, n={m['episodes']})"

    for name in names:
        diffs = []
        for r in with_slices:
            got = {k: r["slices"].get(k, {}).get(name) for k in ("zero_shot", "sft", "rl")}
            keys = ["zero_shot"] * zero + ["sft", "rl"]
            d = ""
            if got["sft"] and got["rl"]:
                diffs.append(100 * (got["rl"]["success"] - got["sft"]["success"]))
                d = f"{diffs[-1]:+.1f}"
            lines.append(f"| {name} | {r['seed']} | "
                         + " | ".join(cell(got[k]) for k in keys) + f" | {d} |")  # fmt: skip
        if diffs:
            m, lo, hi = interval(diffs)
            blank = " | ".join([""] * len(cols))
            lines.append(f"| {name} | mean | {blank} | {m:+.1f} ({span(lo, hi, '+.1f', ' to ')})"
                         " |")  # fmt: skip
    return ["", "Held-out success by slice (95% Wilson interval, episodes):", "", *lines, ""]


def split_baseline(variant: str) -> tuple[str, str] | None:
    """``(RL variant, override)`` when ``variant`` is a non-RL baseline: another variant plus a
    ``BASELINES`` override (RFT from a recipe: ``--variants R "R trainer.rl.stage=rft"``), or the
    override alone, a baseline of the preset as it is (``base``: ``--baselines``); else None."""
    for override, _ in BASELINES.values():
        if variant == override:
            return "base", override
        if variant.endswith(" " + override):
            return variant[: -len(override) - 1], override
    return None


def baseline_groups(by_variant: dict[str, list[dict]]) -> dict[str, list[tuple[str, str]]]:
    """Each RL variant's non-RL baselines among the variants (:func:`split_baseline`), each as
    ``(variant, override)``."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for variant in by_variant:
        if (split := split_baseline(variant)) and split[0] in by_variant:
            groups.setdefault(split[0], []).append((variant, split[1]))
    return groups


def baseline_table(
    by_variant: dict[str, list[dict]], rl_variant: str, bases: list[tuple[str, str]]
) -> list[str]:
    """RL (``rl_variant``) against its non-RL baselines (``bases``, :func:`baseline_groups`): each
    method's final held-out success per seed and its mean (95% t-interval), RL minus each
    baseline paired by seed, and RL minus the best baseline (the one with the highest mean;
    chosen after the fact, which favours it)."""
    rl = {r["seed"]: r["rl"] for r in by_variant[rl_variant]}
    title = "" if rl_variant == "base" else f" of `{rl_variant}`"
    lines = [f"### RL{title} against non-RL baselines", "",
             "| method | final held-out success per seed | mean (95% t-interval) "
             "| RL minus it, paired by seed (points, 95% t-interval) |",
             "|---|---|---|---|"]  # fmt: skip
    best, labels = None, {o: what for o, what in BASELINES.values()}
    for variant, override in [(rl_variant, ""), *bases]:
        rs = by_variant[variant]
        label = labels[override] if override else "RL" + (" (the preset)" if not title else "")
        per = " / ".join(f"{r['rl']:.2f} (seed {r['seed']})" for r in rs)
        m, lo, hi = interval([r["rl"] for r in rs])
        diffs = [100 * (rl[r["seed"]] - r["rl"]) for r in rs if r["seed"] in rl]
        paired = ""
        if override and diffs:
            d, dlo, dhi = interval(diffs)
            paired = f"{d:+.1f} ({span(dlo, dhi, '+.1f', ' to ')}; {len(diffs)} seeds)"
            if best is None or m > best[1]:
                best = (label, m, d, dlo, dhi, len(diffs))
        name = f"{label} (`{override}`)" if override else label
        lines.append(f"| {name} | {per} | {m:.3f} ({span(lo, hi)}) | {paired} |")
    lines += ["", "Budgets: RFT samples the RL stage's episode budget; an SFT baseline run by "
              "`--baselines` trains on the RL run's SFT episodes plus its RL episodes, one given "
              "as a variant (a recipe plus the override) on the SFT stage's own "
              "(`trainer.sft.examples`)."]  # fmt: skip
    if best:
        label, _, d, dlo, dhi, n = best
        lines += [
            "",
            f"**RL minus the best non-RL baseline** ({label}, the highest mean): "
            f"**{d:+.1f} points** ({span(dlo, dhi, '+.1f', ' to ')}; {n} seeds, paired).",
        ]
    return [*lines, ""]


def sampled_table(by_variant: dict[str, list[dict]]) -> list[str]:
    """Each final policy's greedy success, sampled pass@1 and pass@k (``--pass-k``) per seed,
    with means and 95% t-intervals; empty when no run was sampled."""
    rows = [(v, r) for v, rs in by_variant.items() for r in rs if r.get("sampled")]
    if not rows:
        return []
    k = rows[0][1]["sampled"]["k"]
    lines = [f"Final policies on the held-out tasks: greedy, and {k} samples a task at the run's "
             "sampling settings (pass@1, unbiased pass@k):", "",
             f"| variant | seed | greedy | pass@1 | pass@{k} |",
             "|---|---|---|---|---|"]  # fmt: skip
    for variant, rs in by_variant.items():
        rs = [r for r in rs if r.get("sampled")]
        for r in rs:
            smp = r["sampled"]
            lines.append(f"| {variant} | {r['seed']} | {r['rl']:.3f} | {smp['pass@1']:.3f} | "
                         f"{smp[f'pass@{k}']:.3f} |")  # fmt: skip
        if rs:
            cells = [interval([r["rl"] for r in rs]),
                     interval([r["sampled"]["pass@1"] for r in rs]),
                     interval([r["sampled"][f"pass@{k}"] for r in rs])]  # fmt: skip
            lines.append(
                f"| {variant} | mean (95% t) | "
                + " | ".join(f"{m:.3f} ({span(lo, hi)})" for m, lo, hi in cells)
                + " |"
            )
    return [*lines, ""]


def behaviour_table(by_variant: dict[str, list[dict]], window: int = 10) -> list[str]:
    """Per run, tool calls and turns an episode on the held-out tasks (SFT -> final policy, greedy)
    and tool calls an episode in the sampled RL batches, the first ``window`` RL steps against
    the last ``window``; empty when no run recorded them."""
    rows = [(v, r) for v, rs in by_variant.items() for r in rs if r.get("behaviour")]
    if not rows:
        return []

    def pair(b: dict, f: str) -> str:
        a, z = b["sft"].get(f), b["rl"].get(f)
        return "-" if a is None or z is None else f"{a:.2f} -> {z:.2f}"

    lines = ["Behaviour: tool calls and turns an episode on the held-out tasks (SFT -> final "
             f"policy, greedy), and tool calls an episode in the sampled RL batches (mean of the "
             f"first {window} RL steps -> the last {window}):", "",
             "| variant | seed | held-out tool calls | held-out turns | RL batches' tool calls |",
             "|---|---|---|---|---|"]  # fmt: skip
    for variant, r in rows:
        b = r["behaviour"]
        tr = b.get("train_tool_calls") or []
        train = "-"
        if tr:
            n = min(window, len(tr))
            train = f"{statistics.mean(tr[:n]):.2f} -> {statistics.mean(tr[-n:]):.2f}"
        lines.append(f"| {variant} | {r['seed']} | {pair(b, 'mean_tool_calls')} | "
                     f"{pair(b, 'mean_turns')} | {train} |")  # fmt: skip
    return [*lines, ""]


def write(name: str, results: list[dict], root: Path, command: str | None = None) -> str:
    lines = [f"## Experiment `{name}`", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    sft_seeds = sorted({r["sft_seed"] for r in results if r.get("sft_seed") is not None})
    if sft_seeds:
        lines += [f"Seeds are RL seeds (`trainer.rl.seed`), every run's RL from the one SFT result "
                  f"of seed {', '.join(map(str, sft_seeds))}: the intervals are RL's variation "
                  "alone, not SFT's.", ""]  # fmt: skip
    machines = sorted({machine(r["environment"]) for r in results if r.get("environment")})
    if len(machines) == 1:
        lines += [f"Machine: {machines[0]}.", ""]
    elif machines:
        lines += ["Runs from different machines or builds (same config and seed can end "
                  "elsewhere on another; `stages.json`'s `environment`): "
                  + "; ".join(machines) + ".", ""]  # fmt: skip
    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
    if len(by_variant) > 1:  # the comparison at a glance
        first = next(iter(by_variant))
        ref = {r["seed"]: r["rl"] for r in by_variant[first]}
        lines += ["| variant | seeds | mean SFT | mean RL | mean change (points, 95% t-interval) "
                  f"| RL minus {first}'s, paired by seed (points, 95% t-interval) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for variant, rs in by_variant.items():
            m, lo, hi = interval([100 * (r["rl"] - r["sft"]) for r in rs])
            diffs = [100 * (r["rl"] - ref[r["seed"]]) for r in rs if r["seed"] in ref]
            if variant == first:
                paired = ""
            elif not diffs:
                paired = "no common seed"
            else:
                d, dlo, dhi = interval(diffs)
                paired = f"{d:+.1f} ({span(dlo, dhi, '+.1f', ' to ')})"
            lines.append(f"| {variant} | {' '.join(str(r['seed']) for r in rs)} | "
                         f"{statistics.mean(r['sft'] for r in rs):.3f} | "
                         f"{statistics.mean(r['rl'] for r in rs):.3f} | "
                         f"{m:+.1f} ({span(lo, hi, '+.1f', ' to ')}) | {paired} |")  # fmt: skip
        lines.append("")
    for rl_variant, bases in baseline_groups(by_variant).items():
        lines += baseline_table(by_variant, rl_variant, bases)
    lines += sampled_table(by_variant)
    curves = learning_curves(results)
    if curves:
        lines += ["Validation success against RL environment steps (the curves in numbers: mean "
                  "over seeds, 95% t-interval cut to [0, 1]; point 0 is the SFT policy):", "",
                  "| variant | point | env steps (mean) | validation success |",
                  "|---|---|---|---|"]  # fmt: skip
        for variant, pts in curves.items():
            for i, (x, m, lo, hi) in enumerate(pts):
                lines.append(f"| {variant} | {i} | {x:.0f} | {m:.3f} ({span(lo, hi)}) |")
        lines.append("")
        lines += area_table(by_variant)
    lines += behaviour_table(by_variant)
    for variant, rs in by_variant.items():
        final = "final (no stage after SFT)" if all(r.get("no_rl") for r in rs) else "RL"
        lines += [f"### {variant}", "", f"| seed | SFT | {final} | change | wall |"]
        lines.append("|---|---|---|---|---|")
        for r in rs:
            change = 100 * (r["rl"] - r["sft"])
            if r.get("gate"):
                g = r["gate"]
                lines.append(f"| {r['seed']} | {r['sft']:.3f} | not run: SFT validation "
                             f"{g['validation_success']:.3f} < {g['min_success']} | "
                             f"{change:+.1f} | |")  # fmt: skip
                continue
            wall = r["wall_s"] or 0
            lines.append(f"| {r['seed']} | {r['sft']:.3f} | {r['rl']:.3f} | {change:+.1f} | "
                         f"{wall:.0f} s |")  # fmt: skip
        for key in ("sft", "rl"):
            m, lo, hi = interval([r[key] for r in rs])
            lines.append(f"| mean {key.upper()} (95% t-interval over seeds) | {m:.3f} "
                         f"({span(lo, hi)}) | | | |")  # fmt: skip
        m, lo, hi = interval([100 * (r["rl"] - r["sft"]) for r in rs])
        lines += [f"| mean change (points) | {m:+.1f} ({span(lo, hi, '+.1f', ' to ')}) | | | |",
                  ""]  # fmt: skip
        stopped = [str(r["seed"]) for r in rs if r.get("gate")]
        if stopped:
            lines += [f"RL not run on seed(s) {', '.join(stopped)}: the SFT policy's validation "
                      "success was below trainer.rl.start_min_success. They count as RL = SFT "
                      "(no change) in the means above and are left out of the curves.",
                      ""]  # fmt: skip
        modes = sorted({k for r in rs for k in (*r["sft_failures"], *r["rl_failures"])})
        lines += ["| failure mode (sum over seeds) | SFT | RL |", "|---|---|---|"]
        for k in modes:
            a = sum(r["sft_failures"].get(k, 0) for r in rs)
            b = sum(r["rl_failures"].get(k, 0) for r in rs)
            if a or b:
                lines.append(f"| {k} | {a} | {b} |")
        lines += slice_table(rs)
        shown = [f"[seed {r['seed']}]({r['report']})" for r in rs if r["report"]]
        lines += ["", "Side-by-side reports: " + (", ".join(shown) or "none"), ""]
    text = "\n".join(lines)
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.md").write_text(text)
    (root / "results.json").write_text(json.dumps(results, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for variant, pts in curves.items():
            xs = [p[0] for p in pts]
            # a long override set wrapped, so the legend stays inside the plot
            label = "\n".join(textwrap.wrap(variant, 40)) or variant
            k = sum(1 for r in results if r["variant"] == variant and r["curve"])
            label += f" ({k} seed{'s' if k != 1 else ''})"  # gated seeds have no curve
            ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
            if not any(math.isnan(p[2]) for p in pts):  # one seed: no interval
                ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], alpha=0.2)
        ax.set_xlabel("environment steps (RL)")
        ax.set_ylabel("validation success")
        ax.set_title(f"{name}: mean and 95% t-interval over seeds", fontsize=10)
        if ax.lines:  # none when every run stopped before RL
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(root / "curves.png", dpi=120)
    except ImportError:
        pass
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("experiment")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=[""], help="override sets, one per variant")
    ap.add_argument("--out", default="experiments")
    ap.add_argument("--quick", action="store_true", help="a few steps per run (smoke)")
    ap.add_argument("--share-sft", action="store_true",
                    help="the first variant trains SFT (pass \"\" first for the preset as it "
                         "is); every other variant starts RL from its SFT result of the same "
                         "seed (trainer.sft.init_from): RL recipes compared from one SFT, at the "
                         "cost of their RL only")  # fmt: skip
    ap.add_argument(
        "--sft-seed",
        type=int,
        default=None,
        help="one SFT result for every run: the first (variant, seed) trains it with "
        "seed=SFT_SEED, every other run starts RL from it; --seeds are then RL "
        "seeds (trainer.rl.seed), so the intervals hold the SFT policy fixed",
    )
    ap.add_argument(
        "--compile-cache",
        default=None,
        metavar="DIR",
        help="JAX's persistent compilation cache for the jobs (default: <out>/.jax_cache; '' "
        "for none; JAX_COMPILATION_CACHE_DIR, when set, wins)",
    )
    ap.add_argument(
        "--baselines",
        nargs="*",
        choices=list(BASELINES),
        default=None,
        help="the preset's RL and the non-RL baselines (BASELINES; rft, verified and clean, or "
        "those named, run in that order after the preset) at an equal episode budget, in place "
        "of --variants",
    )
    ap.add_argument("--set", nargs="+", default=[], metavar="OVERRIDE",
                    help="overrides for every run, not part of a variant's folder name (e.g. a "
                         "task pool never looked at: env.tasks.corpus_seed=1000)")  # fmt: skip
    ap.add_argument(
        "--pass-k",
        type=int,
        default=None,
        metavar="K",
        help="also sample each final policy K times a task: pass@1 and pass@K",
    )
    ap.add_argument(
        "--tables-only",
        action="store_true",
        help="start no training: write the tables from the runs already finished (an "
        "unfinished run is left out and named)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once (the tiny model's jobs use about one core each)",
    )
    ap.add_argument(
        "--eval-jobs",
        type=int,
        default=1,
        help="evaluations at once across --jobs (each holds its SFT, final and pretrained "
        "policies in memory)",
    )
    args = ap.parse_args()
    global EVAL_GATE
    EVAL_GATE = threading.BoundedSemaphore(max(args.eval_jobs, 1))
    root = Path(args.out) / (args.experiment + ("_quick" if args.quick else ""))
    cache = args.compile_cache if args.compile_cache is not None else Path(args.out) / ".jax_cache"
    if where := use_compile_cache(str(cache) if cache else None):
        print(f"compilation cache: {where}")
    # an SFT baseline given as a variant (``R <override>``) trains its own SFT; RFT shares
    rft = BASELINES["rft"][0]
    variants, extras = args.variants, {}
    own_sft = {v for v in variants if (b := split_baseline(v)) and b[1] != rft}
    shares = [args.share_sft and i > 0 and v not in own_sft for i, v in enumerate(variants)]
    if args.baselines is not None:
        names = args.baselines or ["rft", "verified", "clean"]  # mix: a preset whose SFT differs
        variants = ["", *(BASELINES[n][0] for n in names)]
        shares = [v == rft for v in variants]  # RFT starts from RL's SFT
        budget = equal_budget(preset(args.experiment, [*(QUICK if args.quick else []), *args.set]))
        extras = {v: budget for v, shared in zip(variants, shares, strict=True) if v and not shared}
    units = []  # (variant, seed, source run folder or None), sources before their users
    for i, variant in enumerate(variants):
        for seed in args.seeds:
            src = run_folder(root, variants[0], seed) if shares[i] else None
            if args.sft_seed is not None and (i or seed != args.seeds[0]):
                src = run_folder(root, variants[0], args.seeds[0], args.sft_seed)
            units.append((variant, seed, src))
    futures: dict[str, concurrent.futures.Future] = {}

    def one(variant: str, seed: int, src: Path | None, folder: Path) -> dict:
        if src is not None and str(src) in futures:
            futures[str(src)].result()  # its SFT result first (submitted earlier: no deadlock)
        print(f"{args.experiment} [{variant or 'base'}] seed {seed}", flush=True)
        if args.tables_only and not (folder / "summary.json").exists():
            gated = gated_result(args.experiment, variant, seed, folder, args.sft_seed)
            if gated is None:
                print(f"  not finished, left out: {folder}", flush=True)
            return gated
        try:
            return train_and_eval(args.experiment, variant, seed, root, args.quick, sft_from=src,
                              sft_seed=args.sft_seed, extra=[*args.set, *extras.get(variant, [])],
                              pass_k=args.pass_k)  # fmt: skip
        except SystemExit as e:  # one failed run: the others go on, the tables say it is missing
            print(f"{args.experiment} [{variant or 'base'}] seed {seed}: {e}", flush=True)
            return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        order = []
        for variant, seed, src in units:
            folder = run_folder(root, variant, seed, args.sft_seed)
            futures[str(folder)] = pool.submit(one, variant, seed, src, folder)
            order.append(futures[str(folder)])
        done = [f.result() for f in order]
    results = [r for r in done if r is not None]
    if len(results) < len(done):
        print(
            f"{len(done) - len(results)} of {len(done)} runs failed (above); the tables leave "
            "them out",
            flush=True,
        )
    # the command that runs the experiment (with --tables-only it only wrote the tables)
    argv = [a for a in sys.argv[1:] if a != "--tables-only"]
    command = shlex.join(["python", "scripts/run_experiment.py", *argv])
    print(write(args.experiment, results, root, command=command))


if __name__ == "__main__":
    main()
