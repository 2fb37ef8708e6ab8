"""LoRA through the jobs (``model.lora.rank``): the optimizer trains the adapters alone (a step
changes no base parameter; checkpoints hold the adapters only), the run records the base it was
trained on and refuses a resume onto another one, the KL reference holds adapters only, and the
export writes a PEFT adapter folder or, with ``merge=true``, the full model with the adapters
folded in. Through ``jaxrl-train``'s ``main()`` in-process, as in ``train_cli``."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from train_cli import FAST
from train_cli import main_in_process as _main

from jaxrl_agents.cli.app import compose
from jaxrl_agents.jobs.build import split_params
from jaxrl_agents.jobs.config import RunConfig, from_tree
from jaxrl_agents.jobs.system import build_train
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.step import (
    LossInputs,
    OptimizerConfig,
    init_train_state,
    make_train_step,
)

LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


@pytest.mark.parametrize("top", [None, 1])
def test_a_lora_step_changes_no_base_parameter(top):
    top_layers = [f"model.lora.top_layers={top}"] if top else []
    cfg = from_tree(RunConfig, compose("config", [*FAST, *LORA, *top_layers]))
    system = build_train(cfg)
    layers = system.model.cfg.num_hidden_layers
    assert system.model.lora.q_a.get_value().shape[0] == (top or layers)  # adapted layers only
    graphdef, params, rest = split_params(system.model)
    leaves = nnx.to_flat_state(params)
    assert leaves and all(isinstance(v, nnx.LoRAParam) for _, v in leaves)
    n_train = sum(v.get_value().size for _, v in leaves)
    n_base = sum(v.get_value().size for _, v in nnx.to_flat_state(rest) if hasattr(v, "get_value"))
    assert n_train < 0.2 * n_base  # rank 4 of the tiny 128-wide model
    base_before = jax.tree.map(np.asarray, rest)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=0).build()
    step = make_train_step(graphdef, tx, sft_loss(chunk=64), rest=rest)
    state = init_train_state(params, tx)
    rows = [(list(range(3, 40)), [0] * 10 + [1] * 27)] * 4
    batch = system.collector.sft_batch(rows, slice(0, 4), pack=False, row_multiple=1)
    lora_before = jax.tree.map(np.asarray, state.params)
    state, m = step(state, batch, LossInputs(denom=jnp.sum(batch.loss_mask)))
    assert np.isfinite(float(m["loss"])) and int(state.skipped) == 0
    moved = jax.tree.map(
        lambda a, b: float(np.abs(np.asarray(a) - b).max()), state.params, lora_before
    )
    assert max(jax.tree.leaves(moved)) > 0  # the adapters learn
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, rest), base_before)


def test_lora_run_records_its_base_exports_peft_and_merged(tmp_path, monkeypatch, capsys):
    from jaxrl_agents.cli import export as export_cli
    from jaxrl_agents.jobs.restore import load_policy
    from jaxrl_agents.models import load_pretrained
    from jaxrl_agents.models.lora import merge_lora

    run = tmp_path / "lora"
    argv = [*FAST, *LORA, f"run_dir={run}", "loss.kl_coef=0.01"]
    assert _main(argv, monkeypatch) == 0
    stages = json.loads((run / "stages.json").read_text())
    base = stages["lora_base"]
    assert base["path"].startswith("a fresh model.init") and len(base["fingerprint"]) == 16
    # checkpoints hold the adapters (and optimizer state over them) only
    ckpt = sorted((run / "checkpoints" / "best").iterdir())[-1] / "state"
    saved = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    assert 0 < saved < 0.4 * 4 * 620_000  # params + Adam moments of ~30k adapter floats; the
    # base alone is ~0.62M float32 parameters
    model, _, meta = load_policy(run)
    assert meta["lora_base"] == base
    assert model.cfg.lora.rank == 4
    # the exported adapter and the merged full model
    for merge, name in ((False, "adapter"), (True, "merged")):
        out = tmp_path / name
        monkeypatch.setattr(
            sys,
            "argv",
            ["jaxrl-export", f"run_dir={run}", f"out={out}", f"merge={str(merge).lower()}"],
        )
        export_cli.main()
        files = sorted(p.name for p in out.iterdir())
        if merge:
            assert "model.safetensors" in files and "adapter_config.json" not in files
        else:
            assert files == ["adapter_config.json", "adapter_model.safetensors"]
    merged, _ = load_pretrained(tmp_path / "merged", tokenizer=False)
    ids = np.array([[5, 9, 17, 33, 2]], np.int32)
    pos = np.arange(5, dtype=np.int32)[None]
    want, _ = merge_lora(model)(ids, pos)
    got, _ = merged(ids, pos)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    # a resume onto another base stops in one line, before anything is written
    stages["lora_base"]["fingerprint"] = "0" * 16
    (run / "stages.json").write_text(json.dumps(stages))
    capsys.readouterr()
    code = _main(argv, monkeypatch)
    err = capsys.readouterr().err
    assert code not in (0, None)
    assert "were trained on another base" in err and "0000000000000000" in err, err[-500:]


def test_pretrained_checkpoint_with_from_scratch_settings_warns():
    from jaxrl_agents.jobs.system import pretrained_warning

    def cfg(*overrides):
        return from_tree(RunConfig, compose("config", ["model.path=/models/x", *overrides]))

    line = pretrained_warning(cfg("trainer.sft.copy_steps=10"))  # the demo's sft_lr 1e-3 too
    assert line.count("\n") == 0 and "trainer.sft.copy_steps=10" in line
    assert "trainer.sft.lr=0.001 with full fine-tuning" in line and "trainer=instruct" in line
    assert "optimizer.lr=0.002" in pretrained_warning(
        cfg("trainer.sft.steps=0", "optimizer.lr=2e-3")
    )
    assert pretrained_warning(cfg("trainer=instruct")) is None
    assert pretrained_warning(cfg("trainer=instruct_lora", "optimizer.lr=2e-3")) is None
    assert pretrained_warning(from_tree(RunConfig, compose("config"))) is None  # tiny, fresh
