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


def _real_model_commands() -> list[list[str]]:
    """The bash block of "A real instruct model on CPU", one argv per command."""
    import shlex

    section = README.read_text().split("## A real instruct model on CPU", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    lines = [ln.split("#", 1)[0].strip() for ln in block.splitlines()]
    return [shlex.split(ln) for ln in lines if ln]


def test_readme_real_model_commands_compose():
    """The README's SmolLM2 commands name real keys and presets: each composes into its typed
    config (the runs themselves take minutes on 2 cores: ``scripts/check_real_model.py`` runs them
    as written), the training one with LoRA on the SmolLM2 file and no from-scratch warning."""
    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.jobs.build import pretrained_warning
    from jaxrl_agents.jobs.config import EvalConfig, ExportConfig, RunConfig, from_tree

    cmds = {argv[0].rsplit("/", 1)[-1]: argv[1:] for argv in _real_model_commands()}
    assert set(cmds) == {"jaxrl-eval", "jaxrl-train", "jaxrl-export"}
    train = from_tree(RunConfig, compose("config", cmds["jaxrl-train"]))
    assert train.model.path == "smollm2" and train.model.lora.rank == 16
    assert train.chat.template == "qwen2.5" and train.trainer.rl_steps == 2
    assert pretrained_warning(train) is None
    ev = from_tree(EvalConfig, compose("eval", cmds["jaxrl-eval"]))
    assert ev.policies == ["smollm2"] and ev.tasks == 20
    ex = from_tree(ExportConfig, compose("export", cmds["jaxrl-export"]))
    assert ex.merge and ex.run_dir == "runs/smollm2_lora"
