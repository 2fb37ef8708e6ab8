"""The documentation: the site builds, the configuration reference is current, the README is
short and starts with the two commands, and the commands the pages show work.

Commands of the ```bash blocks of README.md and docs/**/*.md:

* ``jaxrl-train`` / ``jaxrl-eval`` / ``jaxrl-export`` (or ``.venv/bin/...`` of them) must compose
  with Hydra into their typed config (``tests/test_readme.py``'s ``compose_command``: a ``-m``
  sweep composes once per swept value). Composing checks keys, values and presets; it opens no
  path, so a command naming a checkpoint folder that does not exist here still composes.
* **Marker convention**: a command is not composed when one of its lines, or a comment line right
  above it, holds ``# needs: <what>``, e.g. ``# needs: slurm (pip install -e ".[slurm]")`` or
  ``# needs: your package (my_pkg importable)``. Use it where composing cannot work here (a
  launcher plugin that is not installed, a user's own package or config folder); say in it what
  the command needs.
* Other commands must at least point at something that exists: ``make <target>`` a target of the
  Makefile, ``python <file>`` / ``bash <file>`` a file of the repository, ``pip install
  ".[extra]"`` extras of pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from test_readme import NEEDS, bash_commands, compose_command, program

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
JOB_PROGRAMS = ("jaxrl-train", "jaxrl-eval", "jaxrl-export")


def _commands() -> list[tuple[str, list[str], str | None]]:
    return [
        (str(page.relative_to(ROOT)), argv, marker)
        for page in PAGES
        for argv, marker in bash_commands(page.read_text())
    ]


COMMANDS = _commands()
JOB_COMMANDS = [c for c in COMMANDS if program(c[1]) in JOB_PROGRAMS]
OTHER_COMMANDS = [c for c in COMMANDS if program(c[1]) not in JOB_PROGRAMS]


def _id(c: tuple[str, list[str], str | None]) -> str:
    return f"{c[0]}: {' '.join(c[1])[:60]}"


# -- the site --------------------------------------------------------------------------------------


def test_docs_build_strict(tmp_path):
    """``mkdocs build --strict``: every link, anchor, page of the nav, included root file
    (BENCHMARKS.md, EXPERIMENTS.md) and API page (mkdocstrings, static analysis) resolves."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; the test extra has it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    site = tmp_path / "site"
    for page in ("index.html", "reference/config.html", "reference/api.html", "benchmarks.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api.html").read_text()
    assert "jaxrl_agents.algos.advantages.compute_advantages" in api  # docstrings rendered
    assert "Sampler" in (site / "benchmarks.html").read_text()  # BENCHMARKS.md included


def test_every_page_is_in_the_nav():
    """A page left out of ``mkdocs.yml``'s nav is built but unreachable: list every one."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if f" {p}\n" not in nav]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


# -- the configuration reference -------------------------------------------------------------------


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "scripts" / "gen_config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_current(tmp_path, capsys):
    """``docs/reference/config.md`` is what ``scripts/gen_config_reference.py`` writes today (run
    it after changing a config dataclass or a preset), and ``--check`` notices a stale copy."""
    gen = _generator()
    assert gen.main(["--check"]) == 0, capsys.readouterr().err
    stale = tmp_path / "config.md"
    stale.write_text(gen.OUT.read_text().replace("| `trainer.sft.steps` |", "| `trainer.x` |"))
    assert gen.main(["--check", "--out", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_config_reference_covers_every_key():
    """Every key of ``jaxrl-train``'s config has a row with a description: a new field needs an
    attribute docstring (the string literal right after it), or the page says nothing about it."""
    import dataclasses
    import typing

    from jaxrl_agents.jobs.config import RunConfig

    rows = {}
    for line in (ROOT / "docs" / "reference" / "config.md").read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \| ", line)
        if m:
            rows.setdefault(m.group(1), line.rsplit(" | ", 1)[1].removesuffix(" |").strip())

    def keys(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if prefix or not dataclasses.is_dataclass(hints[f.name]):  # a group is a section
                yield prefix + f.name
            if dataclasses.is_dataclass(hints[f.name]):
                yield from keys(hints[f.name], f"{prefix}{f.name}.")

    missing = [k for k in keys(RunConfig) if k not in rows]
    assert not missing, f"keys without a row in docs/reference/config.md: {missing}"
    bare = [k for k in keys(RunConfig) if not rows[k]]
    assert not bare, f"fields without a docstring (the reference has no description): {bare}"


# -- the README ------------------------------------------------------------------------------------


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, (
        f"README.md has {len(lines)} lines (at most 150; move detail to docs/)"
    )
    assert lines[0].startswith("# ")
    first_block = lines[lines.index("```bash") + 1 :][:3]
    assert first_block[0].startswith("make demo   #") and first_block[1].startswith("make test   #")
    assert first_block[2] == "```"
    assert lines.index("```bash") <= 2, "the two commands come first"
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


def test_readme_links_the_docs():
    text = README.read_text()
    for target in ("docs/index.md", "docs/reference/config.md", "BENCHMARKS.md", "EXPERIMENTS.md"):
        assert f"]({target}" in text, target
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in link:
            assert (ROOT / link).exists(), f"README links {link}, which does not exist"


# -- commands --------------------------------------------------------------------------------------


def test_the_pages_have_commands():
    assert len(JOB_COMMANDS) >= 20 and any(marker for _, _, marker in JOB_COMMANDS)


@pytest.mark.parametrize("command", JOB_COMMANDS, ids=_id)
def test_job_command_composes(command):
    page, argv, marker = command
    if marker is not None:
        pytest.skip(f"{NEEDS} {marker}")
    try:
        configs = compose_command(argv)
    except Exception as e:  # noqa: BLE001 - name the page and the command
        raise AssertionError(f"{page}: `{' '.join(argv)}` does not compose: {e}") from e
    assert configs


@pytest.mark.parametrize("command", OTHER_COMMANDS, ids=_id)
def test_other_command_refers_to_what_exists(command):
    page, argv, _ = command
    where = f"{page}: `{' '.join(argv)}`"
    name = program(argv)
    if name == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert all(t in targets for t in argv[1:] if "=" not in t), f"{where}: no such target"
    elif re.fullmatch(r"python3?|bash", name):
        files = [a for a in argv[1:] if re.search(r"\.(py|sh)$", a)]
        assert files and (ROOT / files[0]).is_file(), f"{where}: no such file"
    elif name == "pip":
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        valid = set(extras["optional-dependencies"])
        for arg in argv:
            m = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
            if m:
                bad = set(m.group(1).split(",")) - valid
                assert not bad, f"{where}: no extra {sorted(bad)} in pyproject.toml"


# -- code on the pages -----------------------------------------------------------------------------


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def test_your_env_example_runs():
    """The guide's environment, as written: its oracle solves tasks of every split through the
    real turn protocol, an answer before the lookups fails and is premature, and the tool's
    schema comes from its signature."""
    import asyncio

    from jaxrl_agents.envs.base import drive
    from jaxrl_agents.types import Ann

    env_code, check_code = _python_blocks("docs/guides/your-env.md")[:2]
    scope: dict = {"__name__": "your_env_example"}
    exec(compile(env_code, "docs/guides/your-env.md", "exec"), scope)
    exec(compile(check_code, "docs/guides/your-env.md", "exec"), scope)  # asserts success
    env_cls, oracle = scope["StockEnv"], scope["oracle_policy"]
    for split in ("train", "validation", "heldout"):
        for task in env_cls.make_tasks(split, 3, seed=1):
            verdict, _, _ = asyncio.run(drive(env_cls(), task, oracle(task)))
            assert verdict.success, (split, task.data)
    task = env_cls.make_tasks("heldout", 1)[0]
    guess = {"role": "assistant", "content": str(task.data["answer"] + 1)}
    verdict, _, anns = asyncio.run(drive(env_cls(), task, lambda messages: guess))
    assert not verdict.success and anns[0][Ann.EVIDENCE_COMPLETE] is False
    assert verdict.info[Ann.MISSING_STEPS] == task.data["required_steps"]
    [schema] = env_cls().tools.schemas()
    assert schema["function"]["parameters"]["required"] == ["item"]


def test_your_env_commands_run_on_the_guides_preset(tmp_path, monkeypatch):
    """The guide's marked commands, with what their marker asks for made here: the example as
    ``my_pkg/stock.py`` and the guide's preset as ``conf/env/stock.yaml``. They compose, and the
    preset's mappings fit the class (what the jobs check at start-up)."""
    from jaxrl_agents.jobs.build import resolve_env

    page = (ROOT / "docs/guides/your-env.md").read_text()
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "stock.py").write_text(_python_blocks("docs/guides/your-env.md")[0])
    [preset] = [b for b in re.findall(r"^```yaml\n(.*?)^```", page, re.S | re.M) if "StockEnv" in b]
    (tmp_path / "conf" / "env").mkdir(parents=True)
    (tmp_path / "conf" / "env" / "stock.yaml").write_text(preset)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        marked = [argv for argv, marker in bash_commands(page) if marker and "my_pkg" in marker]
        assert {program(argv) for argv in marked} == {"jaxrl-eval", "jaxrl-train"}
        for argv in marked:
            [cfg] = compose_command(argv)
            env = resolve_env(cfg.env)
            assert env.cls.__name__ == "StockEnv" and env.tasks("train", 2, seed=0)
            env.oracle(cfg.env.oracle)  # the oracle's options fit too
    finally:
        for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
            del sys.modules[name]


def test_reward_presets_of_the_guide_compose(tmp_path):
    """The reward compositions the guide writes as preset files are valid (terms, params)."""
    page = (ROOT / "docs/guides/rewards.md").read_text()
    blocks = [b for b in re.findall(r"^```yaml\n(.*?)^```", page, re.S | re.M) if "terms:" in b]
    assert len(blocks) >= 2
    (tmp_path / "reward").mkdir()
    for i, block in enumerate(blocks):
        (tmp_path / "reward" / f"preset{i}.yaml").write_text(block)
        [cfg] = compose_command(["jaxrl-train", "--config-dir", str(tmp_path), f"reward=preset{i}"])
        assert cfg.reward.terms[0].name == "outcome" and len(cfg.reward.terms) >= 2


def test_reward_term_example_registers():
    from jaxrl_agents.rewards import REWARD_TERMS

    [code] = [b for b in _python_blocks("docs/guides/rewards.md") if "register_reward_term" in b]
    try:
        exec(compile(code, "docs/guides/rewards.md", "exec"), {})
        assert REWARD_TERMS["first_call_valid"].params == {"bonus": 0.1}
    finally:
        REWARD_TERMS.pop("first_call_valid", None)
