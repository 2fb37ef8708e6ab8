"""The wheel ships the Hydra configs, and they compose from an install outside the checkout.

``pip install .`` (not editable) must give a working ``jaxrl-train``: the YAML files of the
top-level ``configs/`` ship as ``jaxrl_agents/conf/`` and ``jaxrl_agents.cli.config_dir()`` finds
them there. The wheel is built from a copy of the checkout (so no ``build/`` folder lands in it)
and unpacked into a folder the checkout does not contain.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"

# Top-level entries of the checkout a wheel build neither needs nor should see.
_SKIP_TOP = {".git", ".venv", "build", "dist", "runs", "outputs", "multirun", "eval"}
_SKIP_ANY = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".ruff_cache", ".hypothesis"
)

_COMPOSE = """
import json
from pathlib import Path

import jaxrl_agents
from jaxrl_agents.cli import config_dir
from jaxrl_agents.cli.app import compose, register_schemas
from jaxrl_agents.cli.train import to_run_config

out = {"package": jaxrl_agents.__file__, "config_dir": config_dir()}
register_schemas()
if True:
    cfg = compose("config")
    out["typed_rl_steps"] = to_run_config(cfg).trainer.rl.steps
    out["keys"] = sorted(cfg.keys())
    out["env"] = sorted(cfg.env.keys())
    out["rl_steps"] = cfg.trainer.rl.steps
    out["advantage"] = cfg.advantage.name
    out["model"] = sorted(cfg.model.keys())
    out["smoke_rl_steps"] = compose("config", overrides=["trainer=smoke"]).trainer.rl.steps
    # Every top-level config (jaxrl-eval's, jaxrl-export's, ...) composes too.
    tops = sorted(p.stem for p in Path(config_dir()).glob("*.yaml"))
    out["tops"] = {name: sorted(compose(name).keys()) for name in tops}
print("RESULT " + json.dumps(out))
"""


def _yaml_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*.yaml")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not importable: cannot build the wheel without build isolation")
    src = tmp_path_factory.mktemp("src")
    for entry in REPO.iterdir():
        if entry.name in _SKIP_TOP or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, src / entry.name, ignore=_SKIP_ANY)
        else:
            shutil.copy2(entry, src / entry.name)
    dist = tmp_path_factory.mktemp("dist")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    proc = subprocess.run(
        [*cmd, str(src), "-w", str(dist)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (whl,) = dist.glob("jaxrl_agents-*.whl")
    return whl


def test_wheel_contains_every_config_and_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        n.removeprefix("jaxrl_agents/conf/") for n in names if n.startswith("jaxrl_agents/conf/")
    }
    expected = _yaml_files(CONFIGS)
    assert "config.yaml" in expected and any(f.startswith("advantage/") for f in expected)
    missing = sorted(expected - shipped)
    assert not missing, f"configs/ files missing from the wheel's jaxrl_agents/conf/: {missing}"

    packages = sorted(
        p.parent.relative_to(REPO).as_posix() for p in (REPO / "jaxrl_agents").rglob("__init__.py")
    )
    missing_pkgs = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing_pkgs, f"packages missing from the wheel: {missing_pkgs}"

    assets = REPO / "jaxrl_agents" / "assets"
    asset_files = sorted(
        p.relative_to(REPO).as_posix()
        for p in assets.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert asset_files, "no assets found in the checkout"
    missing_assets = [a for a in asset_files if a not in names]
    assert not missing_assets, f"assets missing from the wheel: {missing_assets}"


def test_wheel_configs_compose_outside_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [sys.executable, "-c", _COMPOSE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"composing from the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))

    package = Path(out["package"]).resolve()
    assert package.is_relative_to(site.resolve()), f"imported {package}, not the unpacked wheel"
    assert not package.is_relative_to(REPO), package
    assert Path(out["config_dir"]).resolve() == (site / "jaxrl_agents" / "conf").resolve()

    for key in ("env", "trainer", "advantage", "model"):
        assert key in out["keys"], (key, out["keys"])
    assert out["env"], "empty env config group"
    assert isinstance(out["rl_steps"], int) and out["rl_steps"] > 0, out["rl_steps"]
    assert isinstance(out["advantage"], str) and out["advantage"], out["advantage"]
    assert out["model"], "empty model config group"
    assert isinstance(out["smoke_rl_steps"], int), out["smoke_rl_steps"]
    tops = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert sorted(out["tops"]) == tops, (sorted(out["tops"]), tops)
    empty = [name for name, keys in out["tops"].items() if not keys]
    assert not empty, f"top-level configs that composed to nothing: {empty}"
    assert out["typed_rl_steps"] == out["rl_steps"]

    # The user's command itself: `jaxrl-train --cfg job` from the unpacked install, elsewhere.
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_agents.cli.train", "--cfg", "job"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  rl:\n    steps:" in proc.stdout, proc.stdout[-2000:]
    assert "name: calculator" in proc.stdout, proc.stdout[-2000:]
