"""Weights & Biases logging (``trainer.log.wandb``), offline: a sweep job's W&B run holds the job's
config and every metric row of ``metrics.jsonl`` (same steps, ``<stage>/`` keys), its artifacts
and summary; rerunning the command continues the same W&B run; W&B stays off by default, and a
missing ``wandb`` package stops the job at start-up in one line.

The offline run is read back from its ``run-<id>.wandb`` file (a LevelDB-style log of protobuf
``Record`` messages, W&B's transaction log), which holds everything the run sent."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from train_cli import FAST
from train_cli import main_in_process as _main

from jaxrl_agents.jobs.config import ConfigError, RunConfig, build
from jaxrl_agents.training.metrics import RunLogger, read_metrics


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline and silent, every folder it writes under ``tmp_path``, no network (the
    ``wandb`` package is in the ``test`` extra; the tests that need it skip without it)."""
    home = tmp_path / "wandb_home"
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(home),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_ARTIFACT_DIR": str(home / "artifacts"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_DISABLE_GIT": "true",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return home


def _records(path: Path) -> list[Any]:
    """The protobuf ``Record`` messages of a ``.wandb`` file: a 7-byte header (``:W&B``, magic
    0xBEE1, version), then 32 KiB blocks of chunks, each ``crc32 u32, length u16, type u8``
    (1 full, 2 first, 3 middle, 4 last) and its bytes; a block's tail under 7 bytes is padding."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def _read_run(path: Path) -> dict[str, Any]:
    """The run record (id, name, group, tags), config, history rows, artifacts and summary of
    an offline run's ``.wandb`` file."""
    out: dict[str, Any] = {"config": {}, "history": [], "artifacts": [], "summary": {}}

    def items(updates) -> dict[str, Any]:
        return {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in updates}

    for rec in _records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            out.update(id=r.run_id, name=r.display_name, group=r.run_group, tags=list(r.tags))
            out["config"].update(items(r.config.update))
        elif kind == "config":
            out["config"].update(items(rec.config.update))
        elif kind == "history":
            out["history"].append(items(rec.history.item))
        elif kind == "artifact":
            out["artifacts"].append((rec.artifact.type, rec.artifact.name))
        elif kind == "summary":
            out["summary"].update(items(rec.summary.update))
    return out


def _argv(sweep: Path) -> list[str]:
    # the job's folder: <sweep>/job0 (by default named after every override)
    return ["-m", *FAST, "trainer.rl.steps=2", "seed=0", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=job0", "trainer.log.wandb.project=test",
            "trainer.log.wandb.mode=offline", "trainer.log.wandb.tags=[smoke]"]  # fmt: skip


def test_sweep_job_logs_config_metrics_and_artifacts_and_a_rerun_resumes_it(
    tmp_path, monkeypatch, offline_wandb
):
    pytest.importorskip("wandb")
    sweep = tmp_path / "multirun" / "wb_sweep"
    assert _main(_argv(sweep), monkeypatch) == 0
    run_dir = sweep / "job0"
    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{run_id}.wandb"]  # dir= inside the run folder
    got = _read_run(files[0])

    assert got["id"] == run_id and got["name"] == "job0" and got["tags"] == ["smoke"]
    assert got["group"] == "wb_sweep"  # the sweep's name
    cfg = json.loads((run_dir / "config.json").read_text())
    assert got["config"]["trainer"] == cfg["trainer"]  # the full resolved config
    assert got["config"]["trainer"]["log"]["wandb"]["group"] == "wb_sweep"
    assert got["config"]["trainer"]["rl"]["steps"] == 2
    assert {k: got["config"][k] for k in cfg} == cfg

    # every metrics.jsonl row, same stage and step, the same values
    rows = read_metrics(run_dir / "metrics.jsonl")
    logged = []
    for h in got["history"]:
        stages = {k.split("/", 1)[0] for k in h if not k.startswith("_")}
        assert len(stages) == 1, h  # one row of one stage per W&B step
        (stage,) = stages
        logged.append((stage, h[f"{stage}/step"], h))
    assert [(s, st) for s, st, _ in logged] == [(r["stage"], r["step"]) for r in rows]
    assert {r["stage"] for r in rows} == {"sft", "eval", "rl"}
    for (stage, _, h), row in zip(logged, rows, strict=True):
        values = {k: v for k, v in row.items() if k not in ("stage", "step", "time_s")}
        assert {k: h[f"{stage}/{k}"] for k in values} == pytest.approx(values)

    stages = json.loads((run_dir / "stages.json").read_text())
    kinds = sorted(t for t, _ in got["artifacts"])
    assert kinds == ["learning_curve", "results"], got["artifacts"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert got["summary"]["summary/rl_heldout_success"] == summary["rl_heldout_success"]
    assert got["summary"]["rl/step"] == 2
    assert len(stages["curve"]) == 2
    curve = json.loads((run_dir / "wandb" / "curve.json").read_text())
    assert curve == stages["curve"]

    # rerunning the command (a resume of the finished job) continues the same W&B run
    assert _main(_argv(sweep), monkeypatch) == 0
    assert (run_dir / "wandb" / "run_id").read_text().strip() == run_id
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and {f.name for f in files} == {f"run-{run_id}.wandb"}
    again = {_read_run(f)["id"] for f in files}
    assert again == {run_id}


def test_missing_wandb_package_stops_at_start_up(tmp_path, monkeypatch, capsys, offline_wandb):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    run_dir = tmp_path / "run"
    argv = [*FAST, f"run_dir={run_dir}", "trainer.log.wandb.project=test"]
    assert _main(argv, monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "config error: trainer.log.wandb.project=test: the wandb package is not installed; "
        "pip install 'jaxrl_agents[wandb]' (or leave trainer.log.wandb.project unset)"
    )
    written = {p.name for p in run_dir.iterdir()} - {".hydra", "train.log"}  # Hydra's own
    assert written == set()  # the job wrote nothing before stopping


def test_off_by_default(tmp_path):
    spec = RunConfig().trainer.log.wandb
    assert spec.project is None and not spec.enabled
    logger = RunLogger(tmp_path, enabled=True, wandb=spec, config={})
    logger.log(1, {"x": 1.0}, stage="rl")
    logger.close(curve=[{"step": 1}])
    assert logger.wandb is None and not (tmp_path / "wandb").exists()


@pytest.mark.parametrize(
    "wb, key, words",
    [
        ({"project": "p", "mode": "cloud"}, "trainer.log.wandb.mode", "online, offline, disabled"),
        ({"project": ""}, "trainer.log.wandb.project", "non-empty string"),
        ({"project": "p", "tags": ["x" * 65]}, "trainer.log.wandb.tags", "1-64 characters"),
    ],
)
def test_bad_values_name_the_key_and_what_is_valid(wb, key, words):
    with pytest.raises(ConfigError) as e:
        build(RunConfig, {"trainer": {"log": {"wandb": wb}}})
    msg = str(e.value)
    assert msg.startswith(f"{key}: ") and words in msg and "\n" not in msg


def test_group_defaults_to_the_sweep_name_only_in_a_multirun(monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from jaxrl_agents.cli import train as cli

    def tree(**wb):
        return OmegaConf.create(
            {"trainer": {"log": {"wandb": {"project": "p", "group": None, **wb}}}}
        )

    def hydra(mode):
        hc = SimpleNamespace(mode=mode, sweep=SimpleNamespace(dir="multirun/my_sweep"))
        monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hc))

    hydra(RunMode.MULTIRUN)
    t = tree()
    cli._sweep_wandb_group(t)
    assert t.trainer.log.wandb.group == "my_sweep"
    t = tree(group="mine")
    cli._sweep_wandb_group(t)
    assert t.trainer.log.wandb.group == "mine"  # a group given wins
    t = tree(project=None)
    cli._sweep_wandb_group(t)
    assert t.trainer.log.wandb.group is None  # W&B off: the config stays as it was
    hydra(RunMode.RUN)
    t = tree()
    cli._sweep_wandb_group(t)
    assert t.trainer.log.wandb.group is None


def test_wandb_settings_may_change_on_resume(tmp_path):
    import dataclasses

    from jaxrl_agents.jobs.records import RunRecord
    from jaxrl_agents.training.wandb_sink import WandbSpec

    record = RunRecord(tmp_path)
    record.write_config(RunConfig())  # a folder made without W&B
    cfg = RunConfig()
    cfg.trainer.log.wandb = WandbSpec(project="p", tags=["late"], mode="offline")
    record.check_config(cfg, has_checkpoints=True)  # no refusal: only where the logs go
    old = json.loads((tmp_path / "config.json").read_text())
    del old["trainer"]["log"]["wandb"]  # a folder made before the key existed
    (tmp_path / "config.json").write_text(json.dumps(old))
    record.check_config(cfg, has_checkpoints=True)
    changed = dataclasses.replace(cfg, seed=1)
    with pytest.raises(ConfigError, match="seed: 0 -> 1"):  # other keys are still checked
        record.check_config(changed, has_checkpoints=True)


def test_a_run_that_cannot_start_stops_in_one_line(tmp_path, monkeypatch, offline_wandb):
    wandb = pytest.importorskip("wandb")
    from jaxrl_agents.training.wandb_sink import WandbSink, WandbSpec, WandbUnavailable

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty).\ncall wandb.login()")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(WandbUnavailable) as e:
        WandbSink(WandbSpec(project="p", mode="online"), tmp_path, {})
    assert str(e.value) == (
        "trainer.log.wandb.project=p: the W&B run did not start (api_key not configured "
        "(no-tty).); run `wandb login`, or set trainer.log.wandb.mode=offline (upload later "
        "with `wandb sync`)"
    )
