"""orbax checkpoints: periodic async saves, keep-N, keep-best, automatic resume.

Layout of a run folder's ``checkpoints/``::

    checkpoints/latest/<step>/{state,meta}   keep-N most recent (resume reads the newest)
    checkpoints/best/<step>/{state,meta}     the single best by held-out success
    checkpoints/sft/<step>/{state,meta}      the SFT result (= RL starting point), kept for
                                             base-vs-trained comparisons

orbax writes each step into a temporary folder and renames it when complete, so a run killed
mid-save leaves an uncommitted folder that ``latest_step()`` ignores: resume falls back to the
previous complete checkpoint. ``meta`` is JSON: the stage (sft/rl) and the step within it.

A committed step can still be unreadable (a truncated or corrupt array file, a missing ``meta`` or
``state`` item, bad JSON). ``restore()`` without ``step=`` then tries the kept steps newest first,
warning about each one it skips, and reports the step it restored in ``meta["restored_step"]`` (and
``Checkpointer.restored_step``); only when every kept step fails does it raise
:class:`~jaxrl_agents.models.CheckpointError`. The skipped steps are newer than the one resumed
from, so the resumed run rewrites them: the next save to that set deletes them first (otherwise
orbax would skip saves up to the stale step, or refuse a forced save of it).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl_agents.models import CheckpointError

log = logging.getLogger(__name__)


class Checkpointer:
    """Thin wrapper over two ``ocp.CheckpointManager`` instances (latest and best)."""

    def __init__(
        self, directory: str | Path, *, keep: int = 3, async_save: bool = True, best_metric: str
    ):
        self.dir = Path(directory).absolute()
        self.best_metric = best_metric
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save
        )
        self.latest = ocp.CheckpointManager(self.dir / "latest", options=opts)
        best_opts = ocp.CheckpointManagerOptions(
            max_to_keep=1,
            create=True,
            enable_async_checkpointing=async_save,
            best_fn=lambda m: float(m[best_metric] if best_metric in m else next(iter(m.values()))),
            best_mode="max",
            keep_checkpoints_without_metrics=False,
        )
        self.best = ocp.CheckpointManager(self.dir / "best", options=best_opts)
        sft_opts = ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
        self.sft = ocp.CheckpointManager(self.dir / "sft", options=sft_opts)
        self._managers = {"latest": self.latest, "best": self.best, "sft": self.sft}
        self.restored_step: int | None = None  # the step the last restore() read
        self._stale: dict[str, list[int]] = {}  # unreadable steps skipped by restore(), per set

    def manager(self, which: str) -> ocp.CheckpointManager:
        if which not in self._managers:
            raise ValueError(f"which={which!r}: expected one of {sorted(self._managers)}")
        return self._managers[which]

    def save(self, step: int, state: Any, meta: dict[str, Any], *, force: bool = False) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self._drop_stale("latest")
        self._one_save_at_a_time("latest")
        self.latest.save(step, args=args, force=force)

    def save_best(self, step: int, state: Any, meta: dict[str, Any], metrics: dict) -> None:
        """Offer a checkpoint to the keep-best manager (kept only if it beats the current best)."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self._drop_stale("best")
        self._one_save_at_a_time("best")
        self.best.save(step, args=args, metrics={k: float(v) for k, v in metrics.items()})

    def save_sft(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Keep the SFT result (the RL starting point) outside the rotating keep-N set."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self._drop_stale("sft")
        self._one_save_at_a_time("sft")
        self.sft.save(step, args=args, force=True)

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def _one_save_at_a_time(self, which: str) -> None:
        """With several processes, wait for the other sets' saves before starting one.

        Each manager finalizes an async save in its own thread behind a barrier whose key orbax
        does not scope per manager: two sets finalizing at once (``latest`` still committing when
        ``best`` saves) collide on it ("Barrier ... is already ongoing") and fail the run. One
        process has no barrier, so it keeps saving in the background."""
        if jax.process_count() > 1:
            for name, m in self._managers.items():
                if name != which:
                    m.wait_until_finished()

    def restore(self, abstract_state: Any, *, step: int | None = None, which: str = "latest"):
        """Restore ``(state, meta)``; ``abstract_state`` gives structure, dtypes and shardings.

        ``step=None``: the newest kept step of ``which`` (for ``best``: the best one first) that
        restores; unreadable ones are skipped with a warning. ``meta["restored_step"]`` (and
        ``self.restored_step``) is the step read. Raises :class:`CheckpointError` when no kept
        step restores, or when an explicit ``step`` does not; ``FileNotFoundError`` when there is
        no checkpoint at all, or none at the explicit ``step``.
        """
        mngr = self.manager(which)
        kept = sorted(mngr.all_steps(), reverse=True)
        if step is not None:
            if step not in kept:
                raise FileNotFoundError(
                    f"no checkpoint at step {step} under {mngr.directory}; kept steps: "
                    f"{sorted(kept) or 'none'}"
                )
            got = self._try_restore(mngr, abstract_state, step)
            if isinstance(got, str):
                raise CheckpointError(
                    f"cannot restore step {step} from {_step_dir(mngr, step)}: {got}"
                )
            return self._restored(step, *got)
        if not kept:
            raise FileNotFoundError(f"no complete checkpoint under {mngr.directory}")
        if which == "best" and (best := mngr.best_step()) is not None:
            kept = [best] + [s for s in kept if s != best]
        failed: list[str] = []
        for s in kept:
            got = self._try_restore(mngr, abstract_state, s)
            if isinstance(got, str):
                log.warning(
                    "checkpoint %s cannot be restored, skipping it: %s", _step_dir(mngr, s), got
                )
                failed.append(f"step {s}: {_shorten(got, 160)}")
                continue
            self._stale[which] = [int(x) for x in kept[: len(failed)]]
            return self._restored(s, *got)
        raise CheckpointError(
            f"no restorable checkpoint under {mngr.directory}: tried steps "
            f"{', '.join(str(s) for s in kept)} ({'; '.join(failed)})"
        )

    def _try_restore(self, mngr: ocp.CheckpointManager, abstract_state: Any, step: int):
        """``(state, meta)`` of ``step``, or the first line of why it does not restore."""
        try:
            return self._restore_step(mngr, abstract_state, step)
        except Exception as e:  # whatever orbax raises: a truncated file, a missing item, ...
            _silence_abandoned_reads()
            log.debug("restoring %s failed", _step_dir(mngr, step), exc_info=True)
            return _first_line(e)

    def _restore_step(self, mngr: ocp.CheckpointManager, abstract_state: Any, step: int):
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        out = mngr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        meta = out["meta"]
        if not isinstance(meta, dict):
            raise ValueError(f"meta is {type(meta).__name__}, not a JSON object")
        return out["state"], meta

    def _restored(self, step: int, state: Any, meta: dict[str, Any]):
        self.restored_step = int(step)
        return state, {**meta, "restored_step": int(step)}

    def _drop_stale(self, which: str) -> None:
        """Delete the unreadable steps a fallback restore skipped: the resumed run rewrites them,
        and while they exist orbax skips saves at or below them and refuses forced ones."""
        mngr = self.manager(which)
        for step in self._stale.pop(which, []):
            if step in mngr.all_steps():
                log.warning("deleting unreadable checkpoint %s", _step_dir(mngr, step))
                mngr.delete(step)

    def all_steps(self, which: str = "latest") -> list[int]:
        return list(self.manager(which).all_steps())

    def wait(self) -> None:
        for m in self._managers.values():
            m.wait_until_finished()

    def close(self) -> None:
        for m in self._managers.values():
            m.close()


def _step_dir(mngr: ocp.CheckpointManager, step: int) -> Path:
    """The folder of ``step`` (our managers use orbax's default step naming: ``<dir>/<step>``)."""
    return Path(mngr.directory) / ocp.step.standard_name_format().build_name(step)


def _is_abandoned_read(u: Any) -> bool:
    exc = u.exc_value
    return (
        isinstance(exc, Exception)
        and isinstance(exc.__cause__, GeneratorExit)
        and str(exc).startswith("Encountered error while reading array index")
    )


def _silence_abandoned_reads() -> None:
    """Drop the noise a failed orbax restore leaves behind (installed once, on the first failure).

    When one array read fails, orbax abandons the other pending shard reads; whenever they are
    garbage-collected (later, once tensorstore lets go of them), each turns the ``GeneratorExit``
    of its closing into an ``Exception`` carrying a multi-page TensorStore spec, which Python
    prints as "Exception ignored in <coroutine ...>". Only exactly those are dropped.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_drops_abandoned_orbax_reads", False):
        return

    def hook(u: Any) -> None:
        if not _is_abandoned_read(u):
            previous(u)

    hook._drops_abandoned_orbax_reads = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _shorten(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_line(e: BaseException, *, limit: int = 300) -> str:
    """``Type: first line`` of the innermost cause (orbax wraps tensorstore's readable error in
    an exception whose text is a multi-page TensorStore spec)."""
    seen = {id(e)}
    while e.__cause__ is not None and id(e.__cause__) not in seen:
        e = e.__cause__
        seen.add(id(e))
    text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    lines = str(text).strip().splitlines()
    line = f"{type(e).__name__}: {' '.join(lines[0].split())}" if lines else type(e).__name__
    return _shorten(line, limit)
