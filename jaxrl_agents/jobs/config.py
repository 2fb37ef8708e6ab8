"""Typed config groups of the jobs: every default lives in exactly one dataclass.

Each group is a dataclass, most of them next to the code they configure (``AdvantageConfig`` /
``LossConfig`` in ``algos``, ``RewardConfig`` in ``rewards``, ``EngineConfig`` (the ``sampler``
group) in ``generation``, ``RolloutConfig`` in ``rollout``, ``OptimizerConfig`` in ``training``);
the job-level ones (model, chat, env, mesh) and the three job configs (:class:`RunConfig`,
:class:`EvalConfig`, :class:`ExportConfig`) are here, the ``trainer`` group and its sub-groups in
``jobs.trainer_spec``. The Hydra layer (``cli``) registers :func:`schema` of each job config as a
structured config, so YAML files under ``configs/`` only override fields or add presets, and a
typo'd key or a value of the wrong type fails while Hydra composes. :func:`build` then turns the
composed tree into the dataclasses, which check their own ranges (``__post_init__``), and names
the dotted key of any error in one line; a key renamed since an earlier release
(:data:`RENAMED`) is moved to its new one on the way, with a deprecation line
(``jobs.config_tree`` holds these builders).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_agents.algos import AdvantageConfig, LossConfig
from jaxrl_agents.envs import EnvConfig
from jaxrl_agents.generation import EngineConfig
from jaxrl_agents.jobs.config_tree import (  # noqa: F401 (the job configs' builders, re-exported)
    RENAMED,
    build,
    from_record,
    from_tree,
    migrate,
    note_moved,
    schema,
)
from jaxrl_agents.jobs.errors import ConfigError, JobAborted  # noqa: F401 (re-exported)
from jaxrl_agents.jobs.trainer_spec import TrainerSpec
from jaxrl_agents.rewards import RewardConfig
from jaxrl_agents.rollout.model_judge import DEFAULT_RUBRIC
from jaxrl_agents.rollout.orchestrator import RolloutConfig
from jaxrl_agents.serve.episodes import ServeLimits
from jaxrl_agents.training.step import OptimizerConfig


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
    top_layers: int | None = None
    """Adapters on the last N decoder layers only (PEFT's layers_to_transform); null: every
    layer. The backward pass stops at the lowest adapted layer (faster, less memory)."""

    def __post_init__(self) -> None:
        self.config()  # every value checked now, one line naming it

    def config(self):
        """The model's ``LoRAConfig``, or None for full fine-tuning."""
        if self.rank is None:
            return None
        from jaxrl_agents.models.config import LoRAConfig

        return LoRAConfig(self.rank, self.alpha, self.dropout, tuple(self.targets), self.top_layers)


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
    scan_unroll: int = 1
    """Decoder layers per iteration of the layer scan (``ModelConfig.scan_unroll``): 1 compiles
    one layer; the layer count unrolls them all (on CPU faster for full fine-tuning without
    remat only; slower and far larger with remat: see ``ModelConfig.scan_unroll``)."""
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
        unroll = self.scan_unroll
        if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
            raise ValueError(f"scan_unroll={self.scan_unroll!r}: expected a positive integer")


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
    """A registered env name (calculator, sql, research, travel, mcp) or the import path of any
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
    rl_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``options`` of the env the RL (and RFT) training episodes run in, over ``options``;
    held-out and validation episodes keep ``options`` (e.g. the calculator's ``fault_rate:
    0.6``: training meets tool faults more often than the evaluation does)."""
    sft_like_rl: bool = False
    """SFT golden data from the RL episodes' task mix and env (``tasks``; ``options`` with
    ``rl_options``) instead of ``sft_tasks`` / ``sft_options``: an annotator that demonstrates
    what RL trains on (the ``mix`` baseline of ``scripts/run_experiment.py``)."""

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
class JudgeSpec:
    """A judge that is a model (``rollout.model_judge.ModelJudge``), scoring episodes for a
    ``judge`` reward term whose ``params.name`` is ``name`` (e.g. ``reward=judged``)."""

    enabled: bool = False
    """Build the judge model and its engine and register it as ``name``."""
    name: str = "model"
    """The name the ``judge`` reward term refers to (its ``params.name``)."""
    model: str = "reference"
    """``reference``: the policy's weights at RL start, in a second engine never updated; or a
    local Hugging Face folder, a ``.gguf`` file or ``smollm2`` (its own chat template)."""
    rubric: str = DEFAULT_RUBRIC
    """What a good episode is, in words; the prompt adds the episode and the score format."""
    on: str = "answer"
    """``answer``: the task and the final answer; ``trajectory``: the whole episode (turns, tool
    calls and results), cut to ``max_prompt_tokens``."""
    scale: list[float] = dataclasses.field(default_factory=lambda: [0.0, 10.0])
    """``[lo, hi]``: the judge answers ``SCORE: <number in [lo, hi]>``, mapped onto [0, 1]."""
    max_new_tokens: int = 32
    """The judgment's length limit (greedy sampling)."""
    max_prompt_tokens: int = 384
    """The judge prompt's length limit; with ``max_new_tokens`` it must fit
    ``sampler.max_seq_len``."""
    cache: bool = True
    """An identical judge prompt reuses the earlier judgment instead of sampling again."""

    def __post_init__(self) -> None:
        if self.on not in ("answer", "trajectory"):
            raise ValueError(f"on={self.on!r}: expected answer or trajectory")
        if len(self.scale) != 2 or not float(self.scale[0]) < float(self.scale[1]):
            raise ValueError(f"scale={list(self.scale)}: expected [lo, hi] with lo < hi")
        for name in ("max_new_tokens", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if not self.rubric.strip():
            raise ValueError("rubric is empty: say what a good episode is")


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
    judge: JudgeSpec = dataclasses.field(default_factory=JudgeSpec)

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
    sample per task is greedy, ``samples > 1`` samples at ``rollout.sampling`` (``temperature``,
    ``top_p``, ``top_k``, ``min_p``) for pass@k."""

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


@dataclasses.dataclass
class ServeConfig:
    """``jaxrl-serve``: an OpenAI-compatible endpoint over one policy (``jaxrl_agents.serve``).

    The policy is a ``jaxrl-train`` run folder (``run``) or, without one, the ``model`` group's
    model (default: the demo's tiny model; ``model=smollm2`` or ``model.path=<HF folder or GGUF
    file>`` for a checkpoint). A request without an episode key is served as plain inference; the
    trainer's episodes (exact token capture) are opened through the Python API."""

    run: str | None = None
    """A run folder, optionally with ``@latest`` (default), ``@best``, ``@sft`` or ``@<step>`` as
    in ``jaxrl-eval``; its chat settings apply (the ``chat`` group overlays the ones it sets)."""
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    """The model served when ``run`` is null."""
    chat: ChatSpec = dataclasses.field(default_factory=ChatSpec)
    sampler: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    limits: ServeLimits = dataclasses.field(default_factory=ServeLimits)
    """Bounds on one request (a 4xx naming the limit past one)."""
    host: str = "127.0.0.1"
    """Where to listen. Any other than a loopback address needs ``api_key``."""
    port: int = 8000
    """0: any free port (the ``ready_file`` and the start-up line say which)."""
    api_key: str | None = None
    """Bearer key every request must send (``Authorization: Bearer <api_key>``)."""
    model_name: str | None = None
    """The model id ``/v1/models`` lists; null: the run folder's or the checkpoint's name."""
    seed: int = 0
    """Seeds a fresh ``model`` (and the default sampling seeds of requests without one)."""
    ready_file: str | None = None
    """Written with the base URL once the server accepts requests (scripts wait on it)."""
    max_seconds: float | None = None
    """Stop after this long (null: until interrupted)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port}: expected 0 (any free port) to 65535")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds={self.max_seconds}: expected > 0 or null")


JOB_CONFIGS: dict[str, type] = {
    "train": RunConfig,
    "eval": EvalConfig,
    "export": ExportConfig,
    "serve": ServeConfig,
}
