"""Compose registered reward terms into a trajectory reward and per-turn rewards.

For each configured term: ``raw`` (the term's own value, summed over turns) -> clip (bounds the
trajectory total; per-turn values are rescaled so they keep their shares) -> gate (zero unless
the episode succeeded / failed) -> ``weight``. The result is logged per term and assigned either
to the turns that earned it (``assign='turn'``) or, whole, to the last turn
(``assign='trajectory'``); trajectory-level terms (outcome, judge) always land on the last turn.
Hence ``sum(turn_rewards) == total`` whenever the trajectory has turns.

    composer = RewardComposer(RewardConfig.from_dict({"terms": [{"name": "outcome"}]}))
    composed = composer(traj)            # writes traj.reward, traj.reward_terms, turn.reward_terms
    composed = await composer.acompute(traj)   # when an async term (judge) is configured
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from jaxrl_agents.rewards.judge import Judge
from jaxrl_agents.rewards.terms import REWARD_TERMS
from jaxrl_agents.types import Trajectory

_GATES = (None, "success", "failure")
_ASSIGN = ("trajectory", "turn")


@dataclasses.dataclass
class TermConfig:
    """One term of the composition."""

    name: str
    """Registered term (see ``REWARD_TERMS``)."""
    weight: float = 1.0
    """Multiplies the clipped, gated value."""
    clip: tuple[float, float] | None = None
    """Bounds on the term's trajectory total (raw units), applied before the weight."""
    gate: str | None = None
    """None, 'success' (count only on success) or 'failure'."""
    assign: str = "turn"
    """'turn': to the turn that earned it; 'trajectory': all on the last turn."""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword parameters of the term function."""

    def __post_init__(self) -> None:
        if self.name not in REWARD_TERMS:
            raise ValueError(
                f"unknown reward term {self.name!r}; valid: {', '.join(sorted(REWARD_TERMS))}"
            )
        if self.gate not in _GATES:
            raise ValueError(f"term {self.name!r}: gate {self.gate!r} is not one of {_GATES}")
        if self.assign not in _ASSIGN:
            raise ValueError(f"term {self.name!r}: assign {self.assign!r} is not one of {_ASSIGN}")
        if self.clip is not None:
            lo, hi = self.clip
            if lo > hi:
                raise ValueError(f"term {self.name!r}: clip {self.clip} has low > high")
            self.clip = (float(lo), float(hi))
        valid = {k for k in REWARD_TERMS[self.name].params if not k.startswith("_")}
        bad = sorted(set(self.params) - valid)
        if bad:
            raise ValueError(
                f"term {self.name!r}: unknown params {bad}; valid: {', '.join(sorted(valid))}"
            )


@dataclasses.dataclass
class RewardConfig:
    """The reward composition (Hydra group ``reward``)."""

    terms: list[TermConfig] = dataclasses.field(default_factory=lambda: [TermConfig("outcome")])

    def __post_init__(self) -> None:
        names = [t.name for t in self.terms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"reward terms listed twice: {dup} (each is logged under its name)")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardConfig:
        """Build from a Hydra/yaml mapping ``{terms: [{name: ..., weight: ...}, ...]}``."""
        if set(d) - {"terms"}:
            raise ValueError(
                f"unknown reward config keys {sorted(set(d) - {'terms'})}; valid: terms"
            )
        fields = {f.name for f in dataclasses.fields(TermConfig)}
        terms = []
        for i, t in enumerate(d.get("terms", [])):
            t = dict(t)
            if "name" not in t or set(t) - fields:
                raise ValueError(
                    f"reward term #{i} {t}: needs 'name', allowed keys: {', '.join(sorted(fields))}"
                )
            if t.get("clip") is not None:
                t["clip"] = tuple(t["clip"])
            t["params"] = dict(t.get("params") or {})
            terms.append(TermConfig(**t))
        return cls(terms=terms)


@dataclasses.dataclass
class ComposedReward:
    total: float
    terms: dict[str, float]  # weighted, after clip / gate
    raw: dict[str, float]  # the term's own value (trajectory total), before clip / gate / weight
    turn_rewards: list[float]  # len == len(traj.turns); sums to total when there are turns


def _clip_per_turn(per_turn: list[float], raw: float, lo: float, hi: float) -> list[float]:
    clipped = min(max(raw, lo), hi)
    if clipped == raw:
        return per_turn
    if raw != 0.0:
        return [v * clipped / raw for v in per_turn]
    out = list(per_turn)
    if out:
        out[-1] += clipped
    return out


class RewardComposer:
    """Callable reward: ``composer(traj) -> ComposedReward`` (see the module docstring)."""

    def __init__(self, cfg: RewardConfig, *, judges: dict[str, Judge] | None = None):
        self.cfg = cfg
        self.judges = judges or {}
        self.is_async = any(REWARD_TERMS[t.name].is_async for t in cfg.terms)

    def __call__(self, traj: Trajectory) -> ComposedReward:
        if self.is_async:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(self.acompute(traj))
            raise RuntimeError(
                "this reward has an async term (judge); inside an event loop use "
                "`await composer.acompute(traj)`"
            )
        return self._compose(traj, {t.name: self._call(t, traj) for t in self.cfg.terms})

    async def acompute(self, traj: Trajectory) -> ComposedReward:
        values = {}
        for t in self.cfg.terms:
            v = self._call(t, traj)
            values[t.name] = await v if REWARD_TERMS[t.name].is_async else v
        return self._compose(traj, values)

    def _call(self, term: TermConfig, traj: Trajectory):
        spec = REWARD_TERMS[term.name]
        params = dict(term.params)
        if "_judges" in spec.params:
            params["_judges"] = self.judges
        return spec.fn(traj, **params)

    def _compose(self, traj: Trajectory, values: dict[str, Any]) -> ComposedReward:
        n = len(traj.turns)
        turn_rewards = [0.0] * n
        turn_terms: list[dict[str, float]] = [{} for _ in range(n)]
        terms, raws = {}, {}
        for t in self.cfg.terms:
            v = values[t.name]
            if isinstance(v, list | tuple):
                if len(v) != n:
                    raise ValueError(
                        f"reward term {t.name!r} returned {len(v)} per-turn values for {n} turns"
                    )
                per_turn = [float(x) for x in v]
            else:  # trajectory-level value: the last turn earned it
                per_turn = [0.0] * n
                if n:
                    per_turn[-1] = float(v)
            raw = float(sum(per_turn)) if n else float(v if not isinstance(v, list | tuple) else 0)
            raws[t.name] = raw
            if t.clip is not None:
                per_turn = _clip_per_turn(per_turn, raw, *t.clip)
                value = min(max(raw, t.clip[0]), t.clip[1])
            else:
                value = raw
            open_ = t.gate is None or (t.gate == "success") == traj.success
            scale = t.weight if open_ else 0.0
            per_turn = [scale * x for x in per_turn]
            terms[t.name] = scale * value
            if t.assign == "trajectory" and n:
                per_turn = [0.0] * (n - 1) + [sum(per_turn)]
            for k, x in enumerate(per_turn):
                turn_rewards[k] += x
                if x != 0.0 or k == n - 1:
                    turn_terms[k][t.name] = turn_terms[k].get(t.name, 0.0) + x
        total = float(sum(terms.values()))
        traj.reward_terms = dict(terms)
        traj.reward = total
        for turn, tt in zip(traj.turns, turn_terms, strict=True):
            turn.reward_terms = tt
        return ComposedReward(total, terms, raws, turn_rewards)
