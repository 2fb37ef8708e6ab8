"""Mesh construction, the logical->mesh table, and sharded loading over 8 simulated CPU devices.

Regenerate the partition-spec snapshot (after an intended change to the rules table) with
``UPDATE_SNAPSHOTS=1 python -m pytest tests/models/test_sharding.py``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from model_refs import jax_logits, ragged_batch

from jaxrl_agents.models import ModelConfig, Transformer, load_pretrained
from jaxrl_agents.sharding import (
    MeshError,
    logical_to_spec,
    make_mesh,
    partition_specs,
    shard_model,
)

SNAPSHOT = Path(__file__).parent / "snapshots" / "partition_specs.json"
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


def test_make_mesh_fills_minus_one():
    assert dict(make_mesh((1, -1, 1)).shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert dict(make_mesh({"data": -1, "tensor": 2}).shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert dict(make_mesh((2, 2, 2)).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(make_mesh((1, 1, 1), devices=jax.devices()[:1]).shape)["data"] == 1


def test_logical_to_spec_replicates_indivisible_dims():
    mesh = make_mesh((1, 2, 4))
    # 2 KV heads cannot split 4 ways: replicated; 4 query heads can.
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), shape=(64, 2, 16), mesh=mesh) == (
        jax.sharding.PartitionSpec("fsdp")
    )
    assert logical_to_spec(("embed", "q_heads", "head_dim"), shape=(64, 4, 16), mesh=mesh) == (
        jax.sharding.PartitionSpec("fsdp", "tensor")
    )
    assert logical_to_spec(("batch", "seq")) == jax.sharding.PartitionSpec(("data", "fsdp"))
    with pytest.raises(KeyError, match="'nope'"):
        logical_to_spec(("nope",))


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_sharded_load_matches_single_device(hf_checkpoints, shape):
    _, folder = hf_checkpoints["llama3"]
    batch = ragged_batch()
    ref = jax_logits(load_pretrained(folder, tokenizer=False)[0], *batch)

    mesh = make_mesh(shape)
    model, _ = load_pretrained(folder, mesh=mesh, tokenizer=False)
    specs = partition_specs(model, mesh)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        arr = var[...]
        assert str(arr.sharding.spec) == specs[".".join(path)], path
        # No device holds more than its shard: sizes shrink exactly by the sharded axes.
        n_shards = math.prod(
            mesh.shape[a] for ax in arr.sharding.spec if ax for a in np.atleast_1d(ax)
        )
        assert arr.addressable_shards[0].data.size * n_shards == arr.size, path
    if shape != (8, 1, 1):
        assert specs["layers.q"] == str(jax.sharding.PartitionSpec(None, "fsdp", "tensor"))
    got = jax_logits(model, *batch)
    valid = batch[2] != 0
    np.testing.assert_allclose(got[valid], ref[valid], atol=1e-5, rtol=0)


def _snapshot_model() -> Transformer:
    # Every parameter kind at once: q/k/v/o biases, q/k norms, untied head.
    cfg = ModelConfig(
        model_type="qwen3",
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        o_proj_bias=True,
        qk_norm=True,
    )
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def test_partition_spec_snapshot():
    model = _snapshot_model()
    resolved = {"x".join(map(str, s)): partition_specs(model, make_mesh(s)) for s in MESHES}
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(json.dumps(resolved, indent=2, sort_keys=True) + "\n")
    assert resolved == json.loads(SNAPSHOT.read_text())


def test_shard_model_places_and_preserves_logits():
    cfg = ModelConfig(
        model_type="qwen2",
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
    )
    batch = ragged_batch()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    ref = jax_logits(model, *batch)
    mesh = make_mesh((2, 2, 2))
    shard_model(model, mesh)
    assert model.layers.gate[...].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor"
    )
    assert model.embed[...].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    np.testing.assert_allclose(jax_logits(model, *batch), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((3, 1, 1), r"\(3, 1, 1\) needs 3 devices but 8 are available"),
        ((3, -1, 1), r"\(3, -1, 1\) does not fit 8 devices"),
        ((-1, -1, 1), "at most one -1"),
        ((2, 4), "must have 3 entries"),
        ({"data": 2, "model": 4}, r"unknown mesh axes \['model'\]"),
    ],
)
def test_mesh_that_does_not_fit_is_a_clear_error(shape, match):
    with pytest.raises(MeshError, match=match):
        make_mesh(shape)
