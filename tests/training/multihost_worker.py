"""One process of the two-process ``jax.distributed`` test (run by test_multihost.py).

    python multihost_worker.py <process_id> <num_processes> <port> <out.npz>

Each process owns one CPU device and feeds its local rows of the same global batch; the train
step runs over the global mesh (data axis across processes, gloo collectives). Process 0 writes
the final parameters. ``num_processes=1`` is the single-process reference with the whole batch.
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

GLOBAL_BATCH, SEQ = 8, 32


def main() -> None:
    pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if nproc > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.rollout.packing import pack_sft
    from jaxrl_agents.training.objectives import sft_loss
    from jaxrl_agents.training.step import (
        LossInputs,
        OptimizerConfig,
        init_train_state,
        make_train_step,
    )

    mesh = Mesh(np.array(jax.devices()).reshape(nproc, 1, 1), ("data", "fsdp", "tensor"))
    replicated = NamedSharding(mesh, PartitionSpec())
    rows_sharding = NamedSharding(mesh, PartitionSpec("data"))

    cfg = ModelConfig.from_hf_config(
        dict(
            model_type="qwen2",
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
        )
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def to_global(x):
        if not hasattr(x, "shape"):
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, replicated, lambda idx: host[idx])

    params = jax.tree.map(to_global, params)
    rest = jax.tree.map(to_global, rest)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=1).build()
    state = init_train_state(params, tx)
    step = make_train_step(graphdef, tx, sft_loss(chunk=16), rest=rest)

    rng = np.random.default_rng(0)
    for _ in range(2):
        data = []
        for _ in range(GLOBAL_BATCH):
            n = int(rng.integers(8, SEQ))
            data.append((rng.integers(1, 64, n).tolist(), [0] * 4 + [1] * (n - 4)))
        batch, _ = pack_sft(data, buckets=[SEQ])
        per = GLOBAL_BATCH // nproc
        local = jax.tree.map(lambda x, per=per: x[pid * per : (pid + 1) * per], batch)
        gbatch = jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(rows_sharding, x), local
        )
        total = np.float32(batch.loss_mask.sum())
        denom = jax.make_array_from_callback((), replicated, lambda idx, total=total: total)
        state, metrics = step(state, gbatch, LossInputs(denom=denom))
    flat = {
        jax.tree_util.keystr(k): np.asarray(multihost_utils.process_allgather(v, tiled=True))
        for k, v in jax.tree_util.tree_leaves_with_path(state.params)
    }
    if pid == 0:
        np.savez(
            out,
            loss=np.asarray(multihost_utils.process_allgather(metrics["loss"], tiled=True)),
            **flat,
        )
    if nproc > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
