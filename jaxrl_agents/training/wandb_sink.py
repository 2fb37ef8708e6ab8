"""Weights & Biases logging of a run (``trainer.log.wandb``), off by default.

:class:`WandbSpec` is the config; :class:`WandbSink` is what :class:`~jaxrl_agents.training.
metrics.RunLogger` feeds when ``trainer.log.wandb.project`` is set: one W&B run per run folder
(process 0 only), the resolved job config as its config, every metric row the TensorBoard writer
gets (keys ``<stage>/<name>``, each stage with its own step axis ``<stage>/step``, since W&B's own
step must only grow while the job logs SFT, evaluation and RL rows on steps of their own), and at
the end the learning curve and the result files as artifacts. The W&B run id is kept in the run
folder (``wandb/run_id``), so rerunning the command (a resume) continues the same W&B run.

``wandb`` is an optional dependency (``pip install 'jaxrl_agents[wandb]'``): nothing here imports
it unless a project is set, and :func:`require_wandb` stops a job that needs it at start-up.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MODES = ("online", "offline", "disabled")
"""Valid ``trainer.log.wandb.mode`` values (W&B's own)."""
RESULT_FILES = ("summary.json", "learning_curve.png", "report.html", "report.json")
"""Files of the run folder logged as the ``results`` artifact at the end, those that exist."""
ID_FILE = Path("wandb") / "run_id"
"""Where (relative to the run folder) the W&B run id is kept for a resume."""
_INSTALL = "pip install 'jaxrl_agents[wandb]'"


class WandbUnavailable(RuntimeError):
    """``trainer.log.wandb.project`` is set but the ``wandb`` package cannot be imported, or the W&B
    run cannot start (one line, reported as a config error by the entry points)."""


@dataclasses.dataclass
class WandbSpec:
    """Weights & Biases logging (``trainer.log.wandb``); off unless ``project`` is set."""

    project: str | None = None
    """W&B project the run is logged to; None: no W&B logging (the default)."""
    entity: str | None = None
    """W&B entity (user or team) owning the project; None: the logged-in user's default."""
    tags: list[str] = dataclasses.field(default_factory=list)
    """Tags of the W&B run (each 1-64 characters)."""
    mode: str | None = None
    """``online``, ``offline`` (written under the run folder's ``wandb/``, uploaded later with
    ``wandb sync``) or ``disabled``; None: the ``WANDB_MODE`` environment variable, else
    ``online``."""
    group: str | None = None
    """W&B group of the run; None: in a Hydra multirun (``-m``) the sweep's name (its folder's
    name, ``multirun/<name>``), so a sweep's jobs are grouped; else no group."""

    def __post_init__(self) -> None:
        for name in ("project", "entity", "group"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name}={value!r}: expected a non-empty string or null")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: expected {', '.join(MODES)} or null")
        bad = [t for t in self.tags if not isinstance(t, str) or not 1 <= len(t) <= 64]
        if bad:
            raise ValueError(f"tags={self.tags!r}: {bad[0]!r} is not a tag of 1-64 characters")

    @property
    def enabled(self) -> bool:
        """Whether W&B logging is on (a project is set)."""
        return self.project is not None


def require_wandb(spec: WandbSpec) -> None:
    """Stop in one line (:class:`WandbUnavailable`) when ``spec`` turns W&B logging on and the
    ``wandb`` package is not importable; a no-op when it is off."""
    if spec.enabled:
        _import_wandb(spec)


def _import_wandb(spec: WandbSpec) -> Any:
    try:
        import wandb
    except ImportError as e:
        raise WandbUnavailable(
            f"trainer.log.wandb.project={spec.project}: the wandb package is not installed; "
            f"{_INSTALL} (or leave trainer.log.wandb.project unset)"
        ) from e
    return wandb


def new_run_id() -> str:
    """A fresh W&B run id: 8 random lowercase letters and digits (W&B's own id format)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


class WandbSink:
    """The W&B side of a :class:`~jaxrl_agents.training.metrics.RunLogger`: starts (or resumes)
    the run folder's W&B run, logs metric rows, logs the end-of-run artifacts and finishes.

    Made only on the process that writes logs (process 0)."""

    def __init__(self, spec: WandbSpec, run_dir: str | Path, config: Mapping[str, Any]):
        """Start the W&B run of ``run_dir`` (resuming the one whose id the folder keeps) with
        ``config`` (the resolved job config, nested dicts) as its config."""
        wandb = _import_wandb(spec)
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        id_file = self.dir / ID_FILE
        if id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            run_id = new_run_id()
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
        self._stages: set[str] = set()
        try:
            self.run = wandb.init(
                project=spec.project,
                entity=spec.entity,
                group=spec.group,
                tags=list(spec.tags) or None,
                mode=spec.mode,
                dir=str(self.dir),
                name=self.dir.resolve().name,
                id=run_id,
                resume="allow",
                job_type="train",
                config=json.loads(json.dumps(dict(config), default=str)),
            )
        except wandb.errors.Error as e:  # not logged in, no network, a bad entity, ...
            first = " ".join((str(e).strip().splitlines() or [type(e).__name__])[0].split())
            raise WandbUnavailable(
                f"trainer.log.wandb.project={spec.project}: the W&B run did not start ({first}); "
                "run `wandb login`, or set trainer.log.wandb.mode=offline (upload later with "
                "`wandb sync`)"
            ) from e

    @property
    def id(self) -> str:
        """The W&B run id (kept in the run folder's ``wandb/run_id``)."""
        return self.run.id

    def log(self, step: int, stage: str, metrics: Mapping[str, float]) -> None:
        """One metric row: ``<stage>/<name>`` keys on the stage's own step axis
        ``<stage>/step`` (= ``step``, the row's step in ``metrics.jsonl`` and TensorBoard)."""
        if stage not in self._stages:
            self.run.define_metric(f"{stage}/step")
            self.run.define_metric(f"{stage}/*", step_metric=f"{stage}/step")
            self._stages.add(stage)
        row = {f"{stage}/{k}": v for k, v in metrics.items()}
        self.run.log({**row, f"{stage}/step": int(step)})

    def log_results(self, curve: Sequence[Mapping[str, Any]] | None) -> None:
        """End of the run: the learning curve (the run record's ``curve`` points) as the
        artifact ``curve-<run id>`` (``curve.json`` and a table), the result files of the run
        folder (:data:`RESULT_FILES`, those that exist) as ``results-<run id>``, and the scalar
        entries of ``summary.json`` into the W&B run's summary (``summary/<key>``)."""
        import wandb

        base = self.run.id  # unique in the project; a run folder's name may be long or odd
        if curve:
            points = [dict(p) for p in curve]
            path = self.dir / ID_FILE.parent / "curve.json"
            path.write_text(json.dumps(points, indent=1))
            columns = sorted({k for p in points for k in p}, key=lambda k: (k != "step", k))
            table = wandb.Table(columns=columns, data=[[p.get(c) for c in columns] for p in points])
            art = wandb.Artifact(f"curve-{base}", type="learning_curve")
            art.add_file(str(path), name="curve.json")
            art.add(table, "curve")
            self.run.log_artifact(art)
        files = [self.dir / name for name in RESULT_FILES if (self.dir / name).is_file()]
        if files:
            art = wandb.Artifact(f"results-{base}", type="results")
            for f in files:
                art.add_file(str(f), name=f.name)
            self.run.log_artifact(art)
        summary = self.dir / "summary.json"
        if summary.is_file():
            data = json.loads(summary.read_text())
            scalars = {
                f"summary/{k}": v
                for k, v in data.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
            self.run.summary.update(scalars)

    def finish(self) -> None:
        """Finish the W&B run (flushes and, offline, closes its local files)."""
        self.run.finish()
