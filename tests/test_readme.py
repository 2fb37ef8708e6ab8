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


def test_readme_real_model_commands(tmp_path, monkeypatch, capsys):
    """The README's SmolLM2 commands run as written, with fewer tasks and steps: the zero-shot
    evaluation, a LoRA RL job and the merged export (the folder loads, adapters folded in)."""
    import json
    import sys

    from jaxrl_agents.cli import eval as eval_cli
    from jaxrl_agents.cli import export as export_cli
    from jaxrl_agents.cli import train as train_cli

    cmds = {argv[0].rsplit("/", 1)[-1]: argv[1:] for argv in _real_model_commands()}
    assert set(cmds) == {"jaxrl-eval", "jaxrl-train", "jaxrl-export"}
    run_dir = tmp_path / "run"
    small = {
        "jaxrl-eval": ["tasks=1", f"out={tmp_path / 'eval'}"],
        "jaxrl-train": [
            "trainer.rl_steps=1",
            "trainer.tasks_per_step=1",
            "rollout.group_size=2",
            "trainer.heldout_tasks=1",
            "trainer.validation_tasks=1",
            "trainer.progress=false",
            f"run_dir={run_dir}",
        ],
        "jaxrl-export": [f"run_dir={run_dir}", f"out={tmp_path / 'merged'}"],
    }
    mains = {
        "jaxrl-eval": eval_cli.main,
        "jaxrl-train": train_cli.main,
        "jaxrl-export": export_cli.main,
    }
    for name in ("jaxrl-eval", "jaxrl-train", "jaxrl-export"):
        ours = {a.split("=", 1)[0] for a in small[name]}
        argv = [a for a in cmds[name] if a.split("=", 1)[0] not in ours]
        monkeypatch.setattr(sys, "argv", [name, *argv, *small[name]])
        try:
            mains[name]()
        except SystemExit as e:
            assert e.code in (0, None), (name, capsys.readouterr().err[-2000:])
    stages = json.loads((run_dir / "stages.json").read_text())
    assert stages["lora_base"]["path"] == "smollm2"
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["num_hidden_layers"] == 30
