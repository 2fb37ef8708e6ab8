"""The README's "use as a library" snippet runs as written, on a tiny local HF checkpoint, and
its logits match transformers'."""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet() -> str:
    text = README.read_text()
    section = text.split("## Use as a library", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_library_snippet(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from jaxrl_agents.chat import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
    )
    src = tmp_path / "tiny-qwen2"
    hf.save_pretrained(src)
    tok.save_pretrained(src)

    code = _snippet().replace("/models/Qwen2.5-0.5B-Instruct", str(src))
    code = code.replace("/tmp/exported", str(tmp_path / "exported"))
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)

    logits, batch, seg = scope["logits"], scope["batch"], scope["segment_ids"]
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(batch["input_ids"]),
            attention_mask=torch.tensor(batch["attention_mask"]),
        ).logits.numpy()
    valid = seg.astype(bool)
    np.testing.assert_allclose(np.asarray(logits)[valid], ref[valid], atol=1e-4)
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    with torch.no_grad():
        again = back(
            input_ids=torch.tensor(batch["input_ids"]),
            attention_mask=torch.tensor(batch["attention_mask"]),
        ).logits.numpy()
    np.testing.assert_array_equal(again, ref)


# -- shell commands of Markdown files (also used by tests/test_docs.py) ----------------------------

NEEDS = "# needs:"
"""A command whose own lines, or the comment lines right above it, hold this marker is not
composed (see ``tests/test_docs.py``)."""


def bash_commands(text: str) -> list[tuple[list[str], str | None]]:
    """Every command of the ```bash blocks of Markdown ``text``: ``(argv, marker)`` pairs, where
    ``marker`` is what follows ``# needs:`` on the command's lines or on the comment lines right
    above it (None without one). Continuation lines are joined, comments dropped, and a line is
    split at ``;`` and ``&&``."""
    import shlex

    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        lines, above = block.splitlines(), []
        i = 0
        while i < len(lines):
            raw = [lines[i]]
            while raw[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                raw.append(lines[i])
            i += 1
            if not raw[0].strip() or raw[0].lstrip().startswith("#"):
                above = above + raw if raw[0].strip() else []
                continue
            notes = [ln.split(NEEDS, 1)[1].strip() for ln in above + raw if NEEDS in ln]
            above = []
            lex = shlex.shlex(
                " ".join(ln.rstrip().rstrip("\\") for ln in raw), posix=True, punctuation_chars=";&"
            )
            lex.whitespace_split = True
            argv: list[str] = []
            for token in [*lex, ";"]:
                if token in (";", "&&"):
                    if argv:
                        out.append((argv, notes[0] if notes else None))
                    argv = []
                else:
                    argv.append(token)
    return out


JOBS = {
    "jaxrl-train": "config",
    "jaxrl-eval": "eval",
    "jaxrl-export": "export",
    "jaxrl-serve": "serve",
}
"""The entry points whose commands are composed, and their primary configs."""


def program(argv: list[str]) -> str:
    """The command's program name (``.venv/bin/jaxrl-train`` -> ``jaxrl-train``)."""
    return argv[0].rsplit("/", 1)[-1]


def compose_command(argv: list[str]) -> list:
    """Compose a ``jaxrl-train`` / ``jaxrl-eval`` / ``jaxrl-export`` command into its typed config
    (for ``-m``, one config per swept value, every value used at least once); raises on a key,
    value or preset that does not exist. Paths are not opened: composing never loads a model."""
    from pathlib import Path

    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.eval import to_eval_config
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.config import ExportConfig, ServeConfig, from_tree

    build = {
        "jaxrl-train": to_run_config,
        "jaxrl-eval": to_eval_config,
        "jaxrl-export": lambda tree: from_tree(ExportConfig, tree),
        "jaxrl-serve": lambda tree: from_tree(ServeConfig, tree),
    }[program(argv)]
    args, overrides, multirun = list(argv[1:]), [], False
    while args:
        arg = args.pop(0)
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg in ("-c", "--cfg"):
            args.pop(0)
        elif arg in ("-cd", "--config-dir"):
            overrides.append(f"hydra.searchpath=[file://{Path(args.pop(0)).resolve()}]")
        elif arg.startswith("-"):
            raise AssertionError(f"{' '.join(argv)}: flag {arg} is not handled by this check")
        else:
            overrides.append(arg)
    sweeps = [_sweep_values(o) if multirun else [o] for o in overrides]
    runs = max(len(v) for v in sweeps) if sweeps else 1
    return [
        build(compose(JOBS[program(argv)], [v[i % len(v)] for v in sweeps])) for i in range(runs)
    ]


def _sweep_values(override: str) -> list[str]:
    """``key=a,b,c`` -> ``[key=a, key=b, key=c]``; commas inside brackets or quotes do not split."""
    key, sep, value = override.partition("=")
    if not sep:
        return [override]
    parts, depth, quote, cur = [], 0, "", ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return [f"{key}={p}" for p in [*parts, cur]]


def _real_model_commands() -> list[list[str]]:
    """The bash block of "A real instruct model on CPU", one argv per command."""
    section = README.read_text().split("## A real instruct model on CPU", 1)[1]
    block = re.search(r"```bash\n.*?```", section, re.S).group(0)
    return [argv for argv, _ in bash_commands(block)]


def test_readme_real_model_commands_compose():
    """The README's SmolLM2 commands name real keys and presets: each composes into its typed
    config (the runs themselves take minutes on 2 cores: ``scripts/check_real_model.py`` runs them
    as written), the training one with LoRA on the SmolLM2 file and no from-scratch warning."""
    from jaxrl_agents.jobs.system import pretrained_warning

    cmds = {program(argv): argv for argv in _real_model_commands()}
    assert set(cmds) == {"jaxrl-eval", "jaxrl-train", "jaxrl-export"}
    [train] = compose_command(cmds["jaxrl-train"])
    assert train.model.path == "smollm2" and train.model.lora.rank == 16
    assert train.chat.template == "qwen2.5" and train.trainer.rl.steps == 2
    assert pretrained_warning(train) is None
    [ev] = compose_command(cmds["jaxrl-eval"])
    assert ev.policies == ["smollm2"] and ev.tasks == 20
    [ex] = compose_command(cmds["jaxrl-export"])
    assert ex.merge and ex.run_dir == "runs/smollm2_lora"
