"""Checkpointer.restore falls back past unreadable checkpoints (real orbax saves, no mocks)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents.models import CheckpointError
from jaxrl_agents.training.checkpoint import Checkpointer, _is_abandoned_read
from jaxrl_agents.training.step import OptimizerConfig, init_train_state

STEPS = (1, 2, 3)
LOGGER = "jaxrl_agents.training.checkpoint"

# A failed orbax restore abandons its other in-flight tensorstore reads; when one completes later
# it calls back into the closed event loop ("Event loop is closed", reported with object None).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning"
)


def _state(step: int):
    """A small train state whose every array depends on ``step`` (random: zstd cannot shrink it)."""
    k1, k2 = jax.random.split(jax.random.key(step))
    params = {
        "w": jax.random.normal(k1, (64, 48), jnp.float32),
        "b": jax.random.normal(k2, (48,), jnp.float32),
    }
    state = init_train_state(params, OptimizerConfig().build())
    return state._replace(step=jnp.asarray(step, jnp.int32))


def _abstract():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))


def _open(directory: Path) -> Checkpointer:
    return Checkpointer(directory, keep=3, async_save=False, best_metric="heldout_success")


def _assert_state_equal(got, step: int) -> None:
    want = _state(step)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pristine") / "checkpoints"
    ckpt = _open(directory)
    for s in STEPS:
        ckpt.save(s, _state(s), {"stage": "rl", "stage_step": s})
    ckpt.wait()
    ckpt.close()
    return directory


@pytest.fixture
def run_dir(pristine: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "checkpoints"
    shutil.copytree(pristine, directory)
    return directory


def _largest_array_file(step_dir: Path) -> Path:
    """orbax (OCDBT + zarr) writes each array's zstd chunk into a content-addressed data file
    under ``state/ocdbt.process_0/d/``; with random arrays the largest file holds ``params.w``."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def _truncate(step_dir: Path) -> Path:
    f = _largest_array_file(step_dir)
    data = f.read_bytes()
    assert len(data) > 4 * 64 * 48 // 2  # really the weight matrix, not an index file
    f.write_bytes(data[: len(data) // 2])
    return f


def test_layout_and_plain_restore(run_dir: Path):
    step3 = run_dir / "latest" / "3"
    assert (step3 / "meta").is_dir() and (step3 / "state" / "ocdbt.process_0" / "d").is_dir()
    assert _largest_array_file(step3).parent.name == "d"
    ckpt = _open(run_dir)
    assert ckpt.latest_step() == 3 and ckpt.all_steps() == [1, 2, 3]
    state, meta = ckpt.restore(_abstract())
    _assert_state_equal(state, 3)
    assert meta == {"stage": "rl", "stage_step": 3, "restored_step": 3}
    assert ckpt.restored_step == 3
    state, meta = ckpt.restore(_abstract(), step=1)
    _assert_state_equal(state, 1)
    assert meta["restored_step"] == 1 and meta["stage_step"] == 1
    ckpt.close()


def test_truncated_array_falls_back_to_previous_step(run_dir: Path, caplog):
    _truncate(run_dir / "latest" / "3")
    ckpt = _open(run_dir)
    assert ckpt.latest_step() == 3  # still looks committed: the job decides to resume
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state, meta = ckpt.restore(_abstract())
    _assert_state_equal(state, 2)
    assert meta == {"stage": "rl", "stage_step": 2, "restored_step": 2}
    assert ckpt.restored_step == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1
    assert str(run_dir / "latest" / "3") in warnings[0] and "\n" not in warnings[0]
    assert "OUT_OF_RANGE" in warnings[0]  # tensorstore's reason, not the TensorStore spec dump
    ckpt.close()


def test_missing_meta_falls_back(run_dir: Path, caplog):
    shutil.rmtree(run_dir / "latest" / "3" / "meta")
    ckpt = _open(run_dir)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state, meta = ckpt.restore(_abstract())
    _assert_state_equal(state, 2)
    assert meta["restored_step"] == 2 and meta["stage_step"] == 2
    (msg,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert str(run_dir / "latest" / "3") in msg and "meta" in msg
    ckpt.close()


def test_missing_state_and_bad_json_fall_back(run_dir: Path, caplog):
    shutil.rmtree(run_dir / "latest" / "3" / "state")
    (run_dir / "latest" / "2" / "meta" / "metadata").write_text("{not json")
    ckpt = _open(run_dir)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state, meta = ckpt.restore(_abstract())
    _assert_state_equal(state, 1)
    assert meta["restored_step"] == 1
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(msgs) == 2
    assert "latest/3" in msgs[0] and "state" in msgs[0]
    assert "latest/2" in msgs[1] and "JSONDecodeError" in msgs[1]
    ckpt.close()


def test_every_step_unreadable_is_one_line_checkpoint_error(run_dir: Path):
    for s in STEPS:
        _truncate(run_dir / "latest" / str(s))
    ckpt = _open(run_dir)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(_abstract())
    msg = str(info.value)
    assert "\n" not in msg
    assert str(run_dir / "latest") in msg and "tried steps 3, 2, 1" in msg
    assert ckpt.restored_step is None
    ckpt.close()


def test_explicit_step_does_not_fall_back(run_dir: Path):
    _truncate(run_dir / "latest" / "3")
    ckpt = _open(run_dir)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(_abstract(), step=3)
    msg = str(info.value)
    assert "\n" not in msg and "step 3" in msg and str(run_dir / "latest" / "3") in msg
    state, meta = ckpt.restore(_abstract(), step=2)  # a readable explicit step still works
    _assert_state_equal(state, 2)
    assert meta["restored_step"] == 2
    with pytest.raises(FileNotFoundError, match="step 7"):
        ckpt.restore(_abstract(), step=7)
    ckpt.close()


def test_no_checkpoint_is_file_not_found(tmp_path: Path):
    ckpt = _open(tmp_path / "checkpoints")
    assert ckpt.latest_step() is None
    with pytest.raises(FileNotFoundError):
        ckpt.restore(_abstract())
    ckpt.close()


@pytest.mark.parametrize("force", [False, True])
def test_resumed_run_rewrites_the_skipped_step(run_dir: Path, force: bool):
    """After falling back to step 2 the job redoes step 3: its save must not be skipped (orbax
    skips steps <= the newest kept one) nor refused (a forced save of an existing step)."""
    _truncate(run_dir / "latest" / "3")
    ckpt = _open(run_dir)
    ckpt.restore(_abstract())
    assert ckpt.restored_step == 2
    ckpt.save(3, _state(30), {"stage": "rl", "stage_step": 3}, force=force)
    ckpt.wait()
    ckpt.close()
    ckpt = _open(run_dir)
    state, meta = ckpt.restore(_abstract())
    assert meta["restored_step"] == 3
    _assert_state_equal(state, 30)
    assert ckpt.all_steps() == [1, 2, 3]
    ckpt.close()


def test_read_only_restore_leaves_unreadable_steps_in_place(run_dir: Path):
    """Only a save deletes what a fallback skipped: export/eval restores change nothing."""
    _truncate(run_dir / "latest" / "3")
    ckpt = _open(run_dir)
    ckpt.restore(_abstract())
    ckpt.close()
    assert (run_dir / "latest" / "3").is_dir()
    assert _open(run_dir).all_steps() == [1, 2, 3]


def test_only_abandoned_orbax_reads_are_silenced():
    def wrapped(cause: BaseException, text: str) -> Exception:
        try:
            try:
                raise cause
            except BaseException as c:
                raise Exception(text) from c
        except Exception as e:
            return e

    abandoned = wrapped(GeneratorExit(), "Encountered error while reading array index: ().")
    assert _is_abandoned_read(SimpleNamespace(exc_value=abandoned))
    real = wrapped(ValueError("OUT_OF_RANGE"), "Encountered error while reading array index: ().")
    assert not _is_abandoned_read(SimpleNamespace(exc_value=real))
    other = wrapped(GeneratorExit(), "something else")
    assert not _is_abandoned_read(SimpleNamespace(exc_value=other))
