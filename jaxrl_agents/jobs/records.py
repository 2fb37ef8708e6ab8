"""What a training run keeps besides checkpoints: the run folder's records (``config.json``,
``stages.json``, ``summary.json``) and the cadence of periodic work. The run's PRNG streams are
:mod:`jaxrl_agents.rng`."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import jax

from jaxrl_agents.jobs.config import ConfigError, migrate, note_moved

_RESUME_FREE = {
    "trainer.log.progress",
    "trainer.checkpoint.allow_config_change",
    "trainer.rl.start_min_success",
}
"""Keys that may change between a run and its resume without a word."""
_RESUME_FREE_SECTIONS = ("trainer.log.wandb",)
"""Sections whose keys may all change on resume (where the logs go, not what the run does)."""


def _resume_free(key: str) -> bool:
    """Whether dotted ``key`` may change between a run and its resume."""
    return key in _RESUME_FREE or any(
        key == s or key.startswith(f"{s}.") for s in _RESUME_FREE_SECTIONS
    )


def _diff(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, tuple[Any, Any]] = {}
        for k in sorted(set(old) | set(new)):
            key = f"{prefix}.{k}" if prefix else str(k)
            out.update(_diff(old.get(k, "<absent>"), new.get(k, "<absent>"), key))
        return out
    return {} if old == new else {prefix: (old, new)}


def _as_json(cfg: Any) -> Any:
    """A config as its run folder records it (JSON round trip: tuples -> lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _paths(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of a nested dict (sections too) -> its value."""
    out: dict[str, Any] = {prefix: tree} if prefix else {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_paths(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
_CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
"""The host CPU's instruction-set features XLA:CPU can compile for (Linux flag names)."""


def _cpu() -> tuple[str, list[str]]:
    """The host CPU's model name and which of :data:`_CPU_FEATURES` it has."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            name = value.strip()
        elif key.strip() == "flags":  # after the model name in every processor's block
            flags = set(value.split())
            break
    return name, [f for f in _CPU_FEATURES if f in flags]


def environment() -> dict[str, Any]:
    """What produced a run's numbers besides its config and seed: the numeric stack's versions,
    the devices, the host CPU, ``XLA_FLAGS``. On one machine and build a run is bit-reproducible
    (same config and seed, same losses); another CPU or build may round differently, and a small
    model's SFT can then end somewhere else (EXPERIMENTS.md: research seed 2's SFT policy solved
    50% of its held-out tasks on one machine and 0% on another, same code and versions)."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    devices = jax.devices()
    cpu, features = _cpu()
    return {
        "python": platform.python_version(),
        "packages": versions,
        "backend": jax.default_backend(),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "processes": jax.process_count(),
        "host": f"{platform.system()} {platform.machine()}",
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        # the CPUs this process may run on (taskset, cgroups): with one instead of two, the same
        # run's losses differ in the 7th digit within 20 golden SFT steps (EXPERIMENTS.md; most
        # likely XLA:CPU's thread pool follows them and splits reductions across it)
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_features": features,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def every(n: int, step: int) -> bool:
    """Whether periodic work with period ``n`` (0: never) is due after ``step`` (1-based)."""
    return n > 0 and step % n == 0


class RunRecord:
    """The run folder's JSON records; only process 0 writes."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.writer = jax.process_index() == 0
        path = self.dir / "stages.json"
        self.stages: dict[str, Any] = {}
        if path.exists():
            try:
                self.stages = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ConfigError(
                    f"{path} is not valid JSON ({e}): the run's stage records (SFT reference, "
                    "RL gate, LoRA base) cannot be read; restore it or start a new run_dir"
                ) from None

    def _write(self, name: str, data: Any) -> None:
        """Write ``name`` whole or not at all: a run killed mid-write keeps the previous file
        (written beside it, then renamed over it)."""
        if self.writer:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{name}.partial"
            tmp.write_text(json.dumps(data, indent=2, default=str))
            os.replace(tmp, self.dir / name)

    def write_config(self, cfg: Any) -> None:
        self._write("config.json", dataclasses.asdict(cfg))

    def check_config(self, cfg: Any, *, has_checkpoints: bool) -> None:
        """Refuse (one line, before anything is written) to continue a run folder with another
        config than the one it was made with, or with ``trainer.checkpoint.resume=false``. A
        folder made before keys were renamed (``jobs.config.RENAMED``) has its record read with
        the new keys (one line names them)."""
        path = self.dir / "config.json"
        if not has_checkpoints or not path.exists():
            return
        if not cfg.trainer.checkpoint.resume:
            raise ConfigError(
                f"run_dir={str(self.dir)!r} already holds checkpoints and "
                "trainer.checkpoint.resume=false: use a new run_dir (or delete the folder) to "
                "start over"
            )
        stored, moved = migrate(type(cfg), json.loads(path.read_text()))
        note_moved(type(cfg), moved, str(path))
        changed = _diff(stored, _as_json(cfg))
        # A key the folder's config lacks was added by a newer version of the package; at its
        # default it keeps the run as it was made (new options default to the old behaviour),
        # so it does not stop a resume after an upgrade. Any other value is a change.
        defaults = _paths(_as_json(type(cfg)()))
        added = sorted(
            k
            for k, (a, b) in changed.items()
            if a == "<absent>" and k in defaults and b == defaults[k]
        )
        if added:
            print(
                f"resuming a run made before these keys existed, at their defaults: "
                f"{', '.join(f'{k}={changed[k][1]!r}' for k in added)}",
                flush=True,
            )
        diffs = [
            f"{k}: {a!r} -> {b!r}"
            for k, (a, b) in changed.items()
            if not _resume_free(k) and k not in added
        ]
        if diffs and not cfg.trainer.checkpoint.allow_config_change:
            shown = "; ".join(diffs[:6]) + (f"; ... ({len(diffs)} keys)" if len(diffs) > 6 else "")
            raise ConfigError(
                f"run_dir={str(self.dir)!r} was made with a different config ({shown}): rerun "
                "with the same config to resume, use a new run_dir, or pass "
                "trainer.checkpoint.allow_config_change=true to resume anyway"
            )

    def note_environment(self, env: dict[str, Any]) -> None:
        """Record where the run started (``stages.json``'s ``environment``; ``recorded_at:
        resume`` when the folder's run started before this record existed); on a resume
        elsewhere (another CPU, versions, devices or XLA flags) warn in one line naming what
        changed and keep the new one in ``resumed_environments``: the resumed run is then not
        bit-identical to an uninterrupted one."""
        first = self.stages.get("environment")
        if first is None:  # a folder with records but none of this one predates it
            self.stages["environment"] = {**env, "recorded_at": "resume"} if self.stages else env
        else:
            changed = {k: (first.get(k), v) for k, v in env.items() if first.get(k) != v}
            if changed:
                what = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                print(
                    f"WARNING: resuming {str(self.dir)!r} on another machine or build than it "
                    f"started on ({what}): from here the numbers can differ from an "
                    "uninterrupted run's",
                    file=sys.stderr,
                    flush=True,
                )
                self.stages.setdefault("resumed_environments", []).append(env)
        self.save()

    @property
    def curve(self) -> list[dict[str, float]]:
        return self.stages.setdefault("curve", [])

    def set(self, key: str, value: Any) -> None:
        self.stages[key] = value

    def save(self) -> None:
        self._write("stages.json", self.stages)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._write("summary.json", summary)
