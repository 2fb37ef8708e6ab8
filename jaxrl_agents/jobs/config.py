"""Typed config groups of the jobs: every default lives in exactly one dataclass.

Each group is a dataclass, most of them next to the code they configure (``AdvantageConfig`` /
``LossConfig`` in ``algos``, ``RewardConfig`` in ``rewards``, ``EngineConfig`` (the ``sampler``
group) in ``generation``, ``RolloutConfig`` in ``rollout``, ``OptimizerConfig`` in ``training``);
the job-level ones (model, env, mesh, trainer) and the three job configs (:class:`RunConfig`,
:class:`EvalConfig`, :class:`ExportConfig`) are here. The Hydra layer (``cli``) registers
:func:`schema` of each job config as a structured config, so YAML files under ``configs/`` only
override fields or add presets, and a typo'd key or a value of the wrong type fails while Hydra
composes. :func:`build` then turns the composed tree into the dataclasses, which check their own
ranges (``__post_init__``), and names the dotted key of any error in one line.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from jaxrl_agents.algos import AdvantageConfig, LossConfig
from jaxrl_agents.envs import EnvConfig
from jaxrl_agents.generation import EngineConfig
from jaxrl_agents.rewards import RewardConfig
from jaxrl_agents.rollout.orchestrator import RolloutConfig
from jaxrl_agents.training.step import OptimizerConfig
from jaxrl_agents.training.wandb_sink import WandbSpec


class ConfigError(ValueError):
    """A user-facing configuration error (names the dotted key and what is valid)."""


class JobAborted(RuntimeError):
    """A run stopped on purpose (e.g. too many episodes ending in errors): one line, no trace."""


@dataclasses.dataclass
class LoRASpec:
    """LoRA adapters on the policy's projections (``model.lora``); ``rank: null`` = full
    fine-tuning. See ``jaxrl_agents.models.config.LoRAConfig``."""

    rank: int | None = None
    """Adapter rank r; null: no adapters, every parameter is trained."""
    alpha: float = 32.0
    """The update is ``alpha / rank * A @ B`` (PEFT's ``lora_alpha``)."""
    dropout: float = 0.0
    """Dropout on the adapters' input (only 0.0 is implemented)."""
    targets: list[str] = dataclasses.field(
        default_factory=lambda: ["q", "k", "v", "o", "gate", "up", "down"]
    )
    """Wrapped projections: q k v o gate up down (or q_proj ... down_proj)."""

    def __post_init__(self) -> None:
        self.config()  # every value checked now, one line naming it

    def config(self):
        """The model's ``LoRAConfig``, or None for full fine-tuning."""
        if self.rank is None:
            return None
        from jaxrl_agents.models.config import LoRAConfig

        return LoRAConfig(self.rank, self.alpha, self.dropout, tuple(self.targets))


@dataclasses.dataclass
class ModelSpec:
    """Which policy to train (Hydra group ``model``)."""

    path: str | None = None
    """Local Hugging Face folder (config.json + safetensors + tokenizer), a ``.gguf`` file or
    ``smollm2`` (converted once into a cached folder, ``models.gguf``). None: a fresh model from
    ``init`` with the shipped tiny tokenizer."""
    init: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Hugging Face-style config of a fresh model (model_type, hidden_size, ...)."""
    dtype: str = "float32"
    """Compute dtype (float32 | bfloat16)."""
    param_dtype: str = "float32"
    """Parameter (master weight) dtype."""
    remat: bool = False
    """Rematerialise each decoder layer in the backward pass."""
    attention: str = "auto"
    """Multi-query attention (training, prefill): reference | fused | auto (fused on GPU:
    cuDNN flash attention, no materialised scores); see ``ModelConfig.attention``."""
    lora: LoRASpec = dataclasses.field(default_factory=LoRASpec)
    """LoRA adapters (``model.lora.rank=16``); the base stays frozen. Unset rank: full
    fine-tuning."""

    def __post_init__(self) -> None:
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected float32 or bfloat16")
        if self.attention not in ("auto", "reference", "fused"):
            raise ValueError(f"attention={self.attention!r}: expected auto, reference or fused")


@dataclasses.dataclass
class ChatSpec:
    """How conversations become tokens and sampled text becomes tool calls (Hydra group
    ``chat``, read by ``jaxrl-train`` and ``jaxrl-eval``)."""

    tokenizer: str | None = None
    """Tokenizer folder; None: the model folder's own (``model.path``), or the shipped tiny one."""
    template: str | None = None
    """None: the tokenizer's own chat template; else a shipped one (``tiny``, ``qwen2.5``) or the
    path of a template file (``.jinja``, or a ``tokenizer_config.json`` / tokenizer folder whose
    template is used)."""
    tool_parser: str = "auto"
    """Tool-call format of sampled text: ``hermes`` (``<tool_call>{json}</tool_call>``: Qwen,
    Hermes), ``llama3_json`` (a bare ``{"name", "parameters"}`` turn: Llama 3.x), any name
    registered with ``jaxrl_agents.chat.register_tool_parser``, or ``auto``: the one format the
    template renders (start-up fails in one line when that is ambiguous)."""
    thinking: bool | None = None
    """The template's ``enable_thinking`` switch (Qwen3; false: the prompt holds an empty think
    block and the policy answers directly). None: the template's default."""
    max_tool_calls: int = 16
    """Calls run per assistant turn; later ones are answered with a tool error."""

    def __post_init__(self) -> None:
        if self.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls={self.max_tool_calls} must be >= 0")


@dataclasses.dataclass
class EnvSpec(EnvConfig):
    """Which environment (Hydra group ``env``): ``name`` plus the settings every env shares
    (``EnvConfig``: tool timeout, output cap, privileged anchors), the env class's own constructor
    ``options`` and the ``tasks`` generator's keyword arguments (``Env.make_tasks``), and the SFT
    golden data's overrides of both. Every dict is checked against the env class at start-up."""

    name: str = "calculator"
    """A registered env name (calculator, sql, research, travel) or the import path of any
    ``Env`` subclass (``my_pkg.envs.MyEnv``)."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the env class beyond ``EnvConfig`` (e.g. sql's ``max_rows``)."""
    tasks: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of ``make_tasks`` (e.g. calculator's ``two_step_frac``)."""
    oracle: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the env's scripted solver ``oracle_policy`` that writes the SFT
    golden data (e.g. the calculator's ``premature_prob`` / ``premature_words``: an annotator
    that sometimes answers too early)."""

    sft_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``options`` of the env the SFT golden episodes run in, over ``options`` (e.g. the
    calculator's ``fault_rate: 0``: golden traces without tool faults)."""
    sft_tasks: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``make_tasks`` arguments of the SFT golden data, over ``tasks`` (e.g. ``two_step_frac:
    0``: SFT is shown one-step problems only, RL trains on the full mix)."""

    def env_kwargs(self) -> dict[str, Any]:
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(EnvConfig)}
        return {**shared, **self.options}


@dataclasses.dataclass
class MeshSpec:
    """Device mesh over (data, fsdp, tensor); one entry may be -1 (fill remaining devices)."""

    shape: list[int] = dataclasses.field(default_factory=lambda: [1, -1, 1])
    devices: int | None = None
    """Use only the first this many devices (one process); None: all of them."""
    coordinator_address: str | None = None
    """jax.distributed coordinator (host:port); None: from the environment / SLURM, if any."""
    num_processes: int | None = None
    process_id: int | None = None


@dataclasses.dataclass
class TrainerSpec:
    """Stages, batch sizes and cadence (Hydra group ``trainer``)."""

    sft_steps: int = 200
    sft_batch_size: int = 32
    sft_examples: int = 2000
    """Golden trajectories generated by the env's oracle for the SFT stage (with
    ``sft_oracle``)."""
    sft_data: str | None = None
    """Your own SFT data: a JSONL file, one OpenAI-style conversation per line,
    ``{"messages": [...], "tools": [...]}`` (``tools`` optional, other keys ignored, so trajectory
    files the package writes are accepted; see ``jaxrl_agents.training.sft_data``). A relative path
    is resolved against the current working directory. Every line is checked and rendered through
    the policy's chat format at start-up: a bad one stops the run in one line naming its number.
    None: no file."""
    sft_oracle: bool = True
    """Mix the env oracle's golden data (``sft_examples`` episodes) into the SFT pool; false: SFT
    trains on ``sft_data`` only. Batches are drawn uniformly over the pool (the oracle's episodes
    and the file's conversations together)."""
    sft_from: str | None = None
    """A finished run folder whose SFT result this run starts RL from, instead of training its
    own: its ``@sft`` snapshot's policy weights are loaded (a critic this run adds starts fresh),
    and the SFT evaluations run again here. Every setting that shapes the SFT result (``model``,
    ``chat``, ``env``, ``seed`` and the ``trainer.sft_*`` fields) must equal that run's, or the
    job stops naming the keys that differ; so RL recipes compare from one SFT result at a
    fraction of the cost (``scripts/run_experiment.py --share-sft``). None: run SFT here."""
    rl_seed: int | None = None
    """Seed of RL's own random draws (its training tasks, sampling, updates, refills; a critic's
    init) instead of the run's ``seed``, which still makes the model, the SFT data and the
    held-out and validation tasks. With ``sft_from``: several RL seeds from one SFT result, the
    variation of RL alone (``scripts/run_experiment.py --sft-seed``). None: the run's seed."""
    sft_lr: float = 1e-3
    """Peak learning rate of SFT (the ``optimizer`` group's other fields apply; held over the
    ``sft_copy_steps``, then a cosine decay over the rest of the ``sft_steps``)."""
    sft_copy_steps: int = 0
    """Of the ``sft_steps``, how many come first on synthetic copy rows (random token runs, each
    repeated at a random distance; ``training.copy_rows``) instead of golden data: they give a
    freshly initialised model the in-context copy (an induction head) a pretrained checkpoint
    already has.
    The tiny model forms it in ~500 steps (EXPERIMENTS.md). 0: none; leave 0 for a checkpoint."""
    sft_copy_batch: int = 32
    """Copy rows (of 64 tokens) per copy step."""
    rl_steps: int = 30
    rl_stage: str = "rl"
    """What the stage after SFT runs: ``rl`` (the RL updates) or ``rft``, rejection-sampling
    fine-tuning, a non-RL baseline at RL's episode budget and update count (``jobs.baselines``:
    the starting policy samples ``rl_steps x tasks_per_step x rollout.group_size`` episodes, the
    verified ones are kept, ``rl_steps`` SFT steps at ``sft_lr`` train on them)."""
    sft_filter: str = "answered"
    """Which oracle episodes SFT keeps: ``answered`` (every episode that ended with an answer)
    or ``verified`` (only those the env judged successful: an annotator's data filtered by the
    env's own verdict, a non-RL baseline against a habit the annotator has)."""
    rl_start_min_success: float = 0.0
    """RL starts only from a policy whose greedy success on the validation tasks after SFT (or
    from ``sft_from``) is at least this. Below it the job saves the SFT snapshot, records the
    numbers (``stages.json``'s ``rl_gate``) and stops with one line naming both: when no sampled
    episode succeeds, an outcome reward gives RL nothing to reinforce, and the run would spend
    its RL budget for nothing. Rerunning with a lower value continues into RL from the snapshot
    (this key may change on resume). 0: never stops (a start at 0 success is still warned)."""
    tasks_per_step: int = 8
    """Tasks per RL step; each is sampled ``rollout.group_size`` times."""
    ppo_epochs: int = 1
    minibatches: int = 1
    """Optimizer updates per epoch (the rollout batch of ``tasks_per_step * group_size`` rows is
    split into this many; it must divide)."""
    microbatches: int = 1
    """Gradient-accumulation micro-batches per update (must divide a minibatch's rows)."""
    seq_buckets: list[int] | None = None
    """Padded lengths of training rows (one train-step program each). None: 128, 192, 256, 384,
    512, 768, ... up to the first that holds ``rollout.max_total_tokens``. Packed rows
    (``pack_rows``) may take any of them at least as long as the step's longest episode: a bucket
    above the longest episodes lets similar-length ones share rows more tightly (at the cost of
    the longer rows' attention)."""
    pack_rows: bool = True
    """Pack several episodes (SFT sequences) into each training row: first-fit decreasing into
    rows of a ``seq_buckets`` length, each episode its own attention segment with positions from
    0, the row count from a ladder of multiples of minibatches x microbatches x data-parallel
    shards (``rollout.packing``). Same loss and gradients as one episode per row for the same
    minibatch episodes, far fewer padded positions; the step log's ``real_frac`` is the
    episode share of the computed positions. false: one episode per row."""
    logprob_chunk: int = 128
    """Vocabulary projection chunk of the log-prob computation (memory)."""
    eval_every: int = 10
    """Validation evaluation (and keep-best) every this many RL steps; 0: only after SFT and at
    the end (the last step always competes for keep-best)."""
    heldout_tasks: int = 100
    """Held-out (test) tasks: success of the SFT and the final policy is reported on them."""
    validation_tasks: int | None = None
    """Validation tasks (a split disjoint from train and held-out): keep-best selects on them.
    None: as many as ``heldout_tasks``."""
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    async_checkpoints: bool = True
    log_trajectories_every: int = 5
    error_warn_frac: float = 0.05
    """A step (or evaluation) whose share of episodes ending in ``env_error`` / ``reward_error``
    exceeds this is reported on the console with the first error."""
    error_abort_frac: float = 0.5
    """...and one whose share exceeds this stops the run with one line (1.0: never)."""
    off_policy_overlap: bool = False
    """Roll out step t+1 while step t trains (one-step-stale weights; the importance ratio uses
    the rollout logprobs). Weights reach the sampler only between collections, so no episode
    mixes two policies, and ``staleness`` is measured from each episode's policy version."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no advantage for any group estimator) and
    sample fresh groups until the step has ``tasks_per_step`` informative ones (DAPO)."""
    dynamic_sampling_on: str = "reward"
    """What a group must vary in to be kept: ``reward`` (its total reward) or ``outcome`` (its
    success, DAPO's accuracy criterion: an all-failing group that differs only in step or
    validity penalties is dropped too; without that, the shaping alone trains the policy, and on
    sql it taught a policy at 4% success to answer at once: EXPERIMENTS.md)."""
    dynamic_max_rounds: int = 4
    """Most rollout rounds per step with dynamic sampling (the first included): bounds the extra
    rollouts to ``(dynamic_max_rounds - 1) x tasks_per_step`` groups."""
    mask_overlong: bool = False
    """Leave episodes cut off by a length limit (max_tokens, context_full, or a last turn that
    stopped on length) out of the loss; they still count in their group's statistics (DAPO's
    overlong filtering)."""
    resume: bool = True
    """Rerunning into a run folder with checkpoints continues from the newest one (false: refuse
    to touch such a folder)."""
    allow_config_change: bool = False
    """Resume even though the config differs from the one the run folder was made with (by
    default that is refused in one line naming the differing keys)."""
    export: bool = True
    progress: bool = True
    wandb: WandbSpec = dataclasses.field(default_factory=WandbSpec)
    """Weights & Biases logging besides ``metrics.jsonl`` and TensorBoard, on with
    ``trainer.wandb.project=<name>`` (needs ``pip install 'jaxrl_agents[wandb]'``): the config,
    every metric row, and the learning curve and ``summary.json`` as artifacts; a resume continues
    the same W&B run. Off by default; may change on resume."""

    def __post_init__(self) -> None:
        for name in ("sft_steps", "sft_copy_steps", "rl_steps", "eval_every",
                     "log_trajectories_every"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in (
            "sft_batch_size", "sft_copy_batch", "sft_examples", "tasks_per_step", "ppo_epochs",
            "minibatches", "microbatches", "logprob_chunk", "heldout_tasks", "checkpoint_every",
            "keep_checkpoints", "dynamic_max_rounds",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.validation_tasks is not None and self.validation_tasks < 1:
            raise ValueError(f"validation_tasks={self.validation_tasks} must be >= 1 (or null)")
        for name in ("error_warn_frac", "error_abort_frac", "rl_start_min_success"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1]")
        if self.sft_copy_steps and self.sft_copy_steps >= self.sft_steps:
            raise ValueError(
                f"sft_copy_steps={self.sft_copy_steps} must be < sft_steps={self.sft_steps}: the "
                "copy steps are the first of the SFT steps, and golden data needs some"
            )
        if self.rl_stage not in ("rl", "rft"):
            raise ValueError(f"rl_stage={self.rl_stage!r}; valid: rl, rft")
        if self.sft_filter not in ("answered", "verified"):
            raise ValueError(f"sft_filter={self.sft_filter!r}; valid: answered, verified")
        if self.sft_lr <= 0:
            raise ValueError(f"sft_lr={self.sft_lr} must be > 0")
        if self.dynamic_sampling_on not in ("reward", "outcome"):
            raise ValueError(
                f"dynamic_sampling_on={self.dynamic_sampling_on!r} must be 'reward' or 'outcome'"
            )
        if self.sft_data is not None and not self.sft_data.strip():
            raise ValueError("sft_data='' is not a path: give a JSONL file or null")
        if self.rl_seed is not None and (isinstance(self.rl_seed, bool) or self.rl_seed < 0):
            raise ValueError(f"rl_seed={self.rl_seed!r}: expected an integer >= 0 or null")
        if self.sft_from is not None and not self.sft_from.strip():
            raise ValueError("sft_from='' is not a run folder: give one or null")
        if self.sft_steps > 0 and self.sft_data is None and not self.sft_oracle:
            raise ConfigError(
                "trainer.sft_oracle=false and trainer.sft_data=null leave SFT "
                f"(trainer.sft_steps={self.sft_steps}) without data: set "
                "trainer.sft_data=<file.jsonl>, trainer.sft_oracle=true or trainer.sft_steps=0"
            )
        if self.seq_buckets is not None and (not self.seq_buckets or min(self.seq_buckets) < 2):
            raise ValueError(f"seq_buckets={self.seq_buckets}: need lengths >= 2 (or null)")


@dataclasses.dataclass
class RunConfig:
    """``jaxrl-train``: SFT warm start, then RL."""

    seed: int = 0
    name: str = "demo"
    run_dir: str = "runs/demo"
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    chat: ChatSpec = dataclasses.field(default_factory=ChatSpec)
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    sampler: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    trainer: TrainerSpec = dataclasses.field(default_factory=TrainerSpec)

    def __post_init__(self) -> None:
        if "[" in str(self.run_dir) or "]" in str(self.run_dir):
            raise ConfigError(
                f"run_dir={self.run_dir!r}: orbax cannot restore checkpoints from a path with "
                "'[' or ']'; choose a folder name without them (e.g. '(' and ')')"
            )


@dataclasses.dataclass
class EvalConfig:
    """``jaxrl-eval``: evaluate policies (and a run's snapshots) on an env split.

    Sampling settings are the ``rollout`` group's (the same fields training samples with): one
    sample per task is greedy, ``samples > 1`` samples at ``rollout.temperature`` / ``top_p`` /
    ``top_k`` / ``min_p`` for pass@k."""

    policies: list[str] = dataclasses.field(default_factory=list)
    """Policy specs; the first is the baseline of the side-by-side sections."""
    snapshots: str | None = None
    """A jaxrl-train run folder: evaluate all its checkpoints and mark the best."""
    env: EnvSpec | None = None
    """None: the first run policy's env."""
    chat: ChatSpec = dataclasses.field(default_factory=ChatSpec)
    """Chat format of every policy: a field set here overrides a run policy's own ``chat``
    (fields left at their defaults keep the run's); scripted policies render with it (default:
    the shipped tiny tokenizer), an HF folder policy with its own tokenizer unless
    ``chat.tokenizer`` is given."""
    reward: RewardConfig | None = None
    """None: the first run policy's reward, else outcome only."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    sampler: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``Env.make_tasks`` kwargs over the env's ``tasks`` (e.g. ``two_step_frac``)."""
    split: str = "heldout"
    tasks: int = 100
    samples: int = 1
    """Samples per task (G). 1: greedy; more: sampled (pass@k)."""
    ks: list[int] = dataclasses.field(default_factory=lambda: [1])
    seed: int = 0
    out: str = "eval"
    title: str = "jaxrl_agents evaluation"
    max_trajectories: int = 20
    """Trajectories per policy in the report (failures first)."""
    max_pairs: int = 6
    """Side-by-side flipped tasks per comparison."""

    def __post_init__(self) -> None:
        if self.split not in ("train", "validation", "heldout"):
            raise ValueError(f"split={self.split!r}: expected heldout, validation or train")
        if self.tasks < 1 or self.samples < 1:
            raise ValueError(f"tasks={self.tasks}, samples={self.samples}: both must be >= 1")
        bad = [k for k in self.ks if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"ks={self.ks}: every k must be in [1, samples={self.samples}]")


@dataclasses.dataclass
class ExportConfig:
    """``jaxrl-export``: a run's checkpoint -> a Hugging Face folder."""

    run_dir: str | None = None
    which: str = "latest"
    """latest | best | sft."""
    step: int | None = None
    out: str | None = None
    """Default: ``<run_dir>/hf_export_<which>``."""
    max_shard_size: str = "2GB"
    dtype: str | None = None
    """bfloat16 | float32 | float16. Default: the dtype of the run's source checkpoint
    (``model.path``), or the policy's ``param_dtype`` for a fresh model."""
    merge: bool = False
    """A LoRA run (``model.lora.rank``): false writes a PEFT adapter folder (``peft`` loads it
    onto the base model); true writes the full model with the adapters folded into the weights.
    A run without adapters always writes the full model."""

    def __post_init__(self) -> None:
        if self.which not in ("latest", "best", "sft"):
            raise ValueError(f"which={self.which!r}: expected latest, best or sft")
        if self.dtype is not None and self.dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"dtype={self.dtype!r}: expected bfloat16, float32 or float16")


JOB_CONFIGS: dict[str, type] = {"train": RunConfig, "eval": EvalConfig, "export": ExportConfig}


# -- structured-config schemas --------------------------------------------------------------------


def schema(cls: type) -> Any:
    """The OmegaConf structured config of ``cls`` with every node writable (frozen dataclasses
    and tuples would otherwise be read-only, so Hydra could not override them)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    def writable(node: Any) -> None:
        OmegaConf.set_readonly(node, None)
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for k in list(keys):
            child = node._get_node(k)
            if isinstance(child, DictConfig | ListConfig):
                writable(child)

    def declared(node: Any, tp: type) -> None:
        # OmegaConf instantiates the dataclass, and some __post_init__ fill in derived values
        # (EngineConfig's decode windows and prefill rows depend on other fields): put back the
        # declared defaults, so a derived value follows the fields the user overrides.
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            sub = hints[f.name]
            if dataclasses.is_dataclass(sub) and isinstance(node[f.name], DictConfig):
                declared(node[f.name], sub)
            elif f.default is not dataclasses.MISSING:
                node[f.name] = f.default

    node = OmegaConf.structured(cls)
    writable(node)
    declared(node, cls)
    return node


def from_tree(cls: type, tree: Any) -> Any:
    """A composed OmegaConf tree (or plain dict) -> the dataclass ``cls``, strictly."""
    from omegaconf import DictConfig, OmegaConf

    data = OmegaConf.to_container(tree, resolve=True) if isinstance(tree, DictConfig) else tree
    data = dict(data)
    data.pop("hydra", None)
    return build(cls, data)


# -- strict building ------------------------------------------------------------------------------


def build(cls: type, data: Any, path: str = "") -> Any:
    """Strictly build dataclass ``cls`` from nested dicts; errors name the dotted key."""
    if not dataclasses.is_dataclass(cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config key '{path or '<root>'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"'{path}'" if path else "the top level"
        names = ", ".join(repr(f"{path}.{k}" if path else k) for k in unknown)
        raise ConfigError(
            f"unknown config key(s) {names} in {where}; valid keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{path}.{name}" if path else name
        kwargs[name] = _coerce(hints[name], value, key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        field = _culprit(kwargs, str(e))
        key = ".".join(p for p in (path, field) if p) or "config"
        raise ConfigError(f"{key}: {e}") from e


def _culprit(kwargs: dict[str, Any], msg: str) -> str | None:
    """The field a dataclass's validation message is about: named as ``field=`` / ``field:``,
    else the field whose (string) value the message quotes, else a field named as a word."""
    import re

    for name in kwargs:
        if re.search(rf"\b{re.escape(name)}\s*[=:]", msg):
            return name
    for name, value in kwargs.items():
        if isinstance(value, str) and repr(value) in msg:
            return name
    for name in kwargs:
        if re.search(rf"\b{re.escape(name)}\b", msg):
            return name
    return None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, key) if len(args) == 1 else value
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true/false, got {value!r}")
        return value
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if tp is int and float(value) != int(value):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return tp(value)
    if tp is str and not isinstance(value, str):
        raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        args = typing.get_args(tp)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            elem = [args[0] if args else Any] * len(value)
        elif args:
            if len(args) != len(value):
                raise ConfigError(f"config key '{key}' needs {len(args)} entries, got {value!r}")
            elem = list(args)
        else:
            elem = [Any] * len(value)
        items = [
            _coerce(t, v, f"{key}[{i}]") for i, (t, v) in enumerate(zip(elem, value, strict=True))
        ]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return dict(value)
    return value
