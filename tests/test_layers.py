"""The package's layer rules, checked statically on the import graph (nothing is imported).

Every ``import`` / ``from ... import`` anywhere in a module counts: lazy imports inside functions,
relative imports, imports under ``if TYPE_CHECKING:`` (types obey the layers too), module paths
in ``_LAZY``-style dicts (``{"Name": "jaxrl_agents.pkg.mod"}``) and constant
``importlib.import_module("jaxrl_agents...")`` calls. Each import is mapped to its *unit*: the
first component after ``jaxrl_agents.`` (a subpackage, or a top-level module such as ``types``).

Layers, lowest first; a unit imports only from its own layer or below:

1. types, batches, rng, sharding, facts, distributed
2. models, algos, rewards, envs
3. chat, generation
4. rollout, serve
5. training, evaluation
6. jobs
7. cli

Plus: training never imports envs or rollout; evaluation never imports training; envs and rewards
never import models, jax or flax; only cli imports hydra; no import cycles between units; every
``jaxrl_agents.*`` import names a module that exists; every package folder has an ``__init__.py``
and is listed in pyproject's ``[tool.setuptools] packages``; no import cycle between the modules
of one folder (type-only imports aside); no module over ``MAX_MODULE_LINES`` lines
(``LONG_MODULES`` lists the exceptions with their reasons). The top package
(``jaxrl_agents/__init__.py``) and ``assets`` are exempt from the layer rules.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "jaxrl_agents"
TOP = "jaxrl_agents"

LAYERS: dict[str, int] = {
    **dict.fromkeys(("types", "batches", "rng", "sharding", "facts", "distributed"), 1),
    **dict.fromkeys(("models", "algos", "rewards", "envs"), 2),
    **dict.fromkeys(("chat", "generation"), 3),
    **dict.fromkeys(("rollout", "serve"), 4),
    **dict.fromkeys(("training", "evaluation"), 5),
    "jobs": 6,
    "cli": 7,
}
EXEMPT = {"assets"}
# (importer, imported): forbidden even where the layers allow it.
FORBIDDEN = {
    ("training", "envs"): "training never imports envs",
    ("evaluation", "training"): "evaluation never imports training",
    ("training", "evaluation"): "training never imports evaluation (the jobs wire them)",
    ("envs", "models"): "envs never imports models",
    ("rewards", "models"): "rewards never imports models",
    (
        "training",
        "rollout",
    ): "training never imports rollout (device batches are bottom-layer records)",
}
# Modules longer than this are split by what they do; the allow-list names each exception's reason.
MAX_MODULE_LINES = 450
LONG_MODULES: dict[str, str] = {}
# Third-party packages a unit must not import (top-level distribution names).
NO_THIRD_PARTY = {
    "envs": {"jax", "jaxlib", "flax"},
    "rewards": {"jax", "jaxlib", "flax"},
}
HYDRA_ONLY_IN = "cli"


@dataclass(frozen=True)
class Ref:
    """One imported name: ``module`` is absolute; ``attr`` is the name taken from it, if any."""

    file: Path
    line: int
    module: str
    attr: str | None = None
    lazy_string: bool = False  # a dotted path held in a string (may end in a class name)
    type_only: bool = False  # under ``if TYPE_CHECKING:`` (runs no code)

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(REPO).as_posix()}:{self.line}"


def _py_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _existing_modules() -> set[str]:
    return {_module_name(p) for p in _py_files()}


def _resolve_relative(path: Path, level: int, module: str | None) -> str:
    base = _module_name(path).split(".")
    if not _is_package(path):
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _string_paths(node: ast.AST) -> list[tuple[int, str]]:
    """Module paths in strings: values of ``_LAZY``-style dicts and ``import_module("...")``."""
    found: list[tuple[int, str]] = []
    if isinstance(node, ast.Dict):
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                if value.value == TOP or value.value.startswith(TOP + "."):
                    found.append((value.lineno, value.value))
    elif isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        arg = node.args[0]
        if (
            name in ("import_module", "__import__")
            and isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
        ):
            found.append((arg.lineno, arg.value))
    return found


def _refs(path: Path, source: str | None = None) -> list[Ref]:
    """Every import in ``path`` (or in ``source``, parsed as if it were that file)."""
    if source is None:
        source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    refs: list[Ref] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            refs += [
                Ref(path, node.lineno, alias.name, type_only=id(node) in type_only)
                for alias in node.names
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                module = _resolve_relative(path, node.level, node.module)
            else:
                module = node.module or ""
            refs += [
                Ref(path, node.lineno, module, alias.name, type_only=id(node) in type_only)
                for alias in node.names
            ]
        for line, value in _string_paths(node):
            refs.append(Ref(path, line, value, lazy_string=True))
    return sorted(refs, key=lambda r: (r.line, r.module, r.attr or ""))


def _top_lazy() -> dict[str, str]:
    """The top package's ``_LAZY`` map (attribute name -> module path), read statically."""
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(isinstance(t, ast.Name) and t.id.startswith("_LAZY") for t in node.targets):
                return {
                    k.value: v.value
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                }
    return {}


def _units() -> set[str]:
    units = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    units |= {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return units


def _unit_of_module(module: str) -> str | None:
    """The unit of an absolute module path inside the package; None for the top package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _target_unit(ref: Ref, units: set[str], top_lazy: dict[str, str]) -> str | None:
    unit = _unit_of_module(ref.module)
    if unit is None and ref.attr is not None:
        # ``from jaxrl_agents import X``: a unit (submodule) or one of the top's lazy re-exports.
        if ref.attr in units:
            return ref.attr
        if ref.attr in top_lazy:
            return _unit_of_module(top_lazy[ref.attr])
    return unit


def _missing(ref: Ref, modules: set[str]) -> bool:
    if ref.module in modules:
        return False
    if ref.lazy_string:  # "pkg.mod" or "pkg.mod.Class" / "pkg.mod:Class"
        module = ref.module.split(":")[0]
        return module not in modules and module.rpartition(".")[0] not in modules
    return True


def _cycles(edges: dict[str, dict[str, list[Ref]]]) -> list[list[str]]:
    """One shortest cycle for every strongly connected component of more than one unit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    nodes = sorted(set(edges) | {v for targets in edges.values() for v in targets})

    def strongconnect(v: str) -> None:  # Tarjan; the unit graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    for v in nodes:
        if v not in index:
            strongconnect(v)

    cycles = []
    for scc in sorted(sccs):
        start, members = scc[0], set(scc)
        parent: dict[str, str] = {}
        frontier, seen = [start], {start}
        while frontier and start not in parent:  # BFS back to start inside the component
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w not in members:
                        continue
                    if w == start and start not in parent:
                        parent[start] = v
                    elif w not in seen:
                        seen.add(w)
                        parent[w] = v
                        nxt.append(w)
            frontier = nxt
        path, v = [start], parent[start]
        while v != start:
            path.append(v)
            v = parent[v]
        path.append(start)
        cycles.append([*reversed(path)])
    return cycles


def _violations() -> list[str]:
    units, modules, top_lazy = _units(), _existing_modules(), _top_lazy()
    out: list[str] = []
    edges: dict[str, dict[str, list[Ref]]] = defaultdict(lambda: defaultdict(list))

    for unit in sorted(units - set(LAYERS) - EXEMPT):
        out.append(f"jaxrl_agents/{unit}: unit {unit!r} has no layer [add it to LAYERS]")

    for path in _py_files():
        importer = _unit_of_module(_module_name(path))
        for ref in _refs(path):
            if ref.module != TOP and not ref.module.startswith(TOP + "."):
                third = ref.module.split(".")[0]
                if third in NO_THIRD_PARTY.get(importer or "", ()):
                    out.append(
                        f"{ref.where}: {importer} -> {ref.module} "
                        f"[third-party: {importer} never imports {third}]"
                    )
                if third == "hydra" and importer != HYDRA_ONLY_IN:
                    out.append(
                        f"{ref.where}: {importer or TOP} -> {ref.module} "
                        f"[hydra: only {HYDRA_ONLY_IN} imports hydra]"
                    )
                continue
            shown = ref.module + (f".{ref.attr}" if ref.attr and ref.module == TOP else "")
            if _missing(ref, modules):
                out.append(
                    f"{ref.where}: {importer or TOP} -> {ref.module} "
                    f"[missing: no such module in jaxrl_agents/]"
                )
            target = _target_unit(ref, units, top_lazy)
            if importer is None or target is None or importer == target:
                continue
            if importer in EXEMPT or target in EXEMPT:
                continue
            edges[importer][target].append(ref)
            if (importer, target) in FORBIDDEN:
                out.append(
                    f"{ref.where}: {importer} -> {shown} [forbidden: {FORBIDDEN[importer, target]}]"
                )
            if importer in LAYERS and target in LAYERS and LAYERS[target] > LAYERS[importer]:
                out.append(
                    f"{ref.where}: {importer} -> {shown} [layer: {importer} (layer "
                    f"{LAYERS[importer]}) imports {target} (layer {LAYERS[target]})]"
                )

    for cycle in _cycles(edges):
        hops = "; ".join(
            f"{a} -> {b} at " + ", ".join(dict.fromkeys(r.where for r in edges[a][b]))
            for a, b in zip(cycle, cycle[1:], strict=False)
        )
        out.append(f"cycle: {' -> '.join(cycle)} [no import cycles between units: {hops}]")

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools_cfg = pyproject.get("tool", {}).get("setuptools", {})
    listed = set(setuptools_cfg.get("packages", []))
    package_dir = setuptools_cfg.get("package-dir", {})
    for init in sorted(PKG.rglob("__init__.py")):
        name = _module_name(init)
        if "__pycache__" not in init.parts and name not in listed:
            out.append(
                f"{init.parent.relative_to(REPO).as_posix()}: package {name!r} is not listed in "
                "pyproject.toml [tool.setuptools] packages [packaging]"
            )
    for name in sorted(listed):
        folder = REPO / package_dir.get(name, name.replace(".", "/"))
        if not folder.is_dir():
            out.append(
                f"pyproject.toml: listed package {name!r} has no folder {folder} [packaging]"
            )
    for folder in sorted(p for p in PKG.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        if any(folder.glob("*.py")) and not (folder / "__init__.py").is_file():
            out.append(
                f"{folder.relative_to(REPO).as_posix()}: has modules but no __init__.py "
                "(it would not ship) [packaging]"
            )
    return list(dict.fromkeys(out))  # one line per distinct violation, in file and line order


def _folder_cycles() -> list[str]:
    """Import cycles between the modules of one folder (a package's ``__init__`` counts as one of
    its folder's modules). Every import counts, lazy ones too, except type-only ones (under ``if
    TYPE_CHECKING:``): they run no code, so a record may name the class that holds it."""
    modules = _existing_modules()
    edges: dict[str, dict[str, list[Ref]]] = defaultdict(lambda: defaultdict(list))
    folder_of = {_module_name(p): p.parent for p in _py_files()}
    for path in _py_files():
        importer = _module_name(path)
        for ref in _refs(path):
            if ref.type_only or not (ref.module == TOP or ref.module.startswith(TOP + ".")):
                continue
            target = ref.module
            if ref.attr and f"{ref.module}.{ref.attr}" in modules:
                target = f"{ref.module}.{ref.attr}"  # ``from pkg import submodule``
            elif target not in modules:
                target = target.split(":")[0]
                if target not in modules:
                    target = target.rpartition(".")[0]  # "pkg.mod.Class" in a string
            if target == importer or target not in folder_of:
                continue
            if folder_of[target] == path.parent:
                edges[importer][target].append(ref)
    out = []
    for cycle in _cycles(edges):
        hops = "; ".join(
            f"{a} -> {b} at " + ", ".join(dict.fromkeys(r.where for r in edges[a][b]))
            for a, b in zip(cycle, cycle[1:], strict=False)
        )
        out.append(f"cycle: {' -> '.join(cycle)} [no import cycle inside a folder: {hops}]")
    return out


def _long_modules() -> list[str]:
    out = []
    for path in _py_files():
        rel = path.relative_to(REPO).as_posix()
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES and rel not in LONG_MODULES:
            out.append(
                f"{rel}: {n} lines [size: split modules over {MAX_MODULE_LINES} lines by what "
                "they do, or add the module to LONG_MODULES with the reason]"
            )
    for rel in sorted(LONG_MODULES):
        path = REPO / rel
        if not path.is_file() or len(path.read_text(encoding="utf-8").splitlines()) <= (
            MAX_MODULE_LINES
        ):
            out.append(f"{rel}: listed in LONG_MODULES but missing or short [stale allow-list]")
    return out


def test_no_cycles_inside_a_folder():
    cycles = _folder_cycles()
    if cycles:
        pytest.fail(f"{len(cycles)} cycle(s):\n" + "\n".join(cycles), pytrace=False)


def test_module_sizes():
    long = _long_modules()
    if long:
        pytest.fail(f"{len(long)} module(s) too long:\n" + "\n".join(long), pytrace=False)


def test_layer_rules():
    violations = _violations()
    if violations:
        pytest.fail(
            f"{len(violations)} layer-rule violation(s):\n" + "\n".join(violations), pytrace=False
        )


def test_checker_sees_every_kind_of_import():
    """The parser counts lazy, relative, TYPE_CHECKING and ``_LAZY`` imports; skips third party."""
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
import numpy as np
from . import step
from ..envs import base
if TYPE_CHECKING:
    from jaxrl_agents.jobs import train
_LAZY = {"X": "jaxrl_agents.cli.train"}
def f():
    import importlib
    import jaxrl_agents.evaluation.runner
    return importlib.import_module("jaxrl_agents.rollout.scripted")
"""
    refs = _refs(PKG / "training" / "_sample.py", source)  # parsed only, never written
    modules = {r.module for r in refs}
    assert {"__future__", "typing", "numpy", "importlib"} <= modules
    assert {
        "jaxrl_agents.training",
        "jaxrl_agents.envs",
        "jaxrl_agents.jobs",
        "jaxrl_agents.cli.train",
        "jaxrl_agents.evaluation.runner",
        "jaxrl_agents.rollout.scripted",
    } <= modules
    units = {_unit_of_module(m) for m in modules if m.startswith(TOP + ".")}
    assert units == {"training", "envs", "jobs", "cli", "evaluation", "rollout"}
    assert _resolve_relative(PKG / "training" / "__init__.py", 1, "step") == (
        "jaxrl_agents.training.step"
    )
    ref = refs[:1]
    graph = {"a": {"b": ref}, "b": {"c": ref, "d": ref}, "c": {"a": ref}, "d": {}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b": ref}, "b": {}}) == []
    assert [r.type_only for r in refs if r.module == "jaxrl_agents.jobs"] == [True]
    assert not any(r.type_only for r in refs if r.module != "jaxrl_agents.jobs")
