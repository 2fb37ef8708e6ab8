"""An export is faithful to the checkpoint a run started from.

Source: a tiny random Qwen2 checkpoint saved by transformers in bfloat16, with a
``generation_config.json`` (two eos ids, sampling defaults) and the shipped tokenizer saved by
``save_pretrained`` (transformers 5 puts the template in ``chat_template.jinja``). Loaded in fp32
(what ``model=hf`` trains in) and exported, the folder is bf16 again, bit-identical, with the
source's eos list and sampling defaults (the run's sampling settings on top) and the source's
tokenizer files byte for byte; ``dtype=`` overrides. A real ``jaxrl-train`` run from that folder
and ``jaxrl-export`` of its checkpoint give the same.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from model_refs import TINY, ragged_batch

from jaxrl_agents.models import ModelConfig, Transformer, export_pretrained, load_pretrained
from jaxrl_agents.models.hf_io import SINGLE_FILE, TOKENIZER_FILES, hf_tensors, source_dtype

VOCAB = 1280  # the shipped tiny tokenizer's
SOURCE_GEN = dict(bos_token_id=1, eos_token_id=[2, 0], pad_token_id=0, do_sample=True,
                  temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)  # fmt: skip
GENERATED = {"config.json", "generation_config.json", SINGLE_FILE}


def _dtypes(folder) -> set[str]:
    return {str(t.dtype) for t in _state(folder).values()}


def _state(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / SINGLE_FILE))


def _tokenizer_files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name not in GENERATED
            and p.is_file()}  # fmt: skip


def _logits(folder) -> tuple[np.ndarray, torch.dtype]:
    from model_refs import hf_logits
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens, positions, seg = ragged_batch(vocab=VOCAB)
    return hf_logits(model, tokens, positions, seg)[seg != 0], model.dtype


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A bf16 Qwen2 checkpoint + generation_config.json + the tiny tokenizer, all saved by
    transformers."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    from jaxrl_agents.chat import load_tiny_tokenizer

    torch.manual_seed(0)
    cfg = Qwen2Config(**{**TINY, "vocab_size": VOCAB}, rope_theta=1e6, eos_token_id=2,
                      pad_token_id=0)  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.2 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(**SOURCE_GEN)
    folder = tmp_path_factory.mktemp("bf16_source")
    model.save_pretrained(folder)
    load_tiny_tokenizer(cached=False).save_pretrained(folder)
    assert _dtypes(folder) == {"torch.bfloat16"}
    assert (folder / "chat_template.jinja").is_file()  # what transformers 5 writes
    return folder


def test_unchanged_weights_export_bit_identical_in_the_source_dtype(source, tmp_path):
    model, tok = load_pretrained(source, param_dtype="float32")
    assert model.cfg.param_dtype == "float32"
    run_sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    export_pretrained(model, tmp_path, tokenizer=tok, source=source, tokenizer_source=source,
                      generation=run_sampling)  # fmt: skip

    assert _dtypes(tmp_path) == {"torch.bfloat16"}
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    want, got = _state(source), _state(tmp_path)
    assert sorted(want) == sorted(got)
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name
    (want_logits, want_dtype), (got_logits, got_dtype) = _logits(source), _logits(tmp_path)
    assert want_dtype == got_dtype == torch.bfloat16
    np.testing.assert_array_equal(got_logits, want_logits)

    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and gen["bos_token_id"] == 1 and gen["pad_token_id"] == 0
    assert gen["repetition_penalty"] == 1.05  # a source default the run does not set
    for k, v in run_sampling.items():  # the run's sampling settings win
        assert gen[k] == v, k
    from transformers import GenerationConfig

    assert GenerationConfig.from_pretrained(tmp_path).eos_token_id == [2, 0]

    assert _tokenizer_files(tmp_path) == _tokenizer_files(source)  # byte for byte
    assert "chat_template.jinja" in _tokenizer_files(tmp_path)


def test_dtype_override_and_the_safetensors_fallback(source, tmp_path):
    model, tok = load_pretrained(source, param_dtype="float32")
    for dtype, torch_dtype in (("float32", torch.float32), ("float16", torch.float16)):
        out = tmp_path / dtype
        export_pretrained(model, out, tokenizer=tok, source=source, dtype=dtype)
        assert _dtypes(out) == {str(torch_dtype)}
        assert json.loads((out / "config.json").read_text())["torch_dtype"] == dtype
        for name, tensor in _state(source).items():  # bf16 values are exact in fp32 and fp16
            assert torch.equal(tensor.to(torch_dtype), _state(out)[name]), name
    with pytest.raises(ValueError, match="dtype='int8': expected one of bfloat16, float32"):
        export_pretrained(model, tmp_path / "bad", source=source, dtype="int8")
    # A source whose config.json names no dtype: the safetensors tensors' dtype.
    bare = tmp_path / "bare"
    bare.mkdir()
    hf = json.loads((source / "config.json").read_text())
    hf.pop("dtype", None)
    hf.pop("torch_dtype", None)
    (bare / "config.json").write_text(json.dumps(hf))
    (bare / SINGLE_FILE).write_bytes((source / SINGLE_FILE).read_bytes())
    assert source_dtype(source) == source_dtype(bare) == "bfloat16"
    # No source: the model's param_dtype, and the tokenizer re-saved.
    export_pretrained(model, tmp_path / "fresh", tokenizer=tok)
    assert _dtypes(tmp_path / "fresh") == {"torch.float32"}


def test_greedy_run_drops_the_sources_sampling_flags(source, tmp_path):
    from transformers import GenerationConfig

    model, tok = load_pretrained(source)
    greedy = {"do_sample": False}
    export_pretrained(model, tmp_path, tokenizer=tok, source=source, generation=greedy)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["eos_token_id"] == [2, 0]
    assert not {"temperature", "top_p", "top_k"} & set(gen)  # transformers refuses them greedy
    GenerationConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "resaved")


def _fresh_model(eos=None):
    cfg = ModelConfig(model_type="qwen2", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      eos_token_id=eos)  # fmt: skip
    from flax import nnx

    return Transformer(cfg, rngs=nnx.Rngs(0))


def test_without_a_source_eos_is_the_tokenizers_plus_the_given_stop_ids(tmp_path):
    from jaxrl_agents.chat import load_tiny_tokenizer

    tok = load_tiny_tokenizer()
    export_pretrained(_fresh_model(), tmp_path / "one", tokenizer=tok)
    gen = json.loads((tmp_path / "one" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2  # one id: an int, as before
    export_pretrained(_fresh_model(eos=0), tmp_path / "two", tokenizer=tok, stop_token_ids=[2, 0])
    gen = json.loads((tmp_path / "two" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [0, 2]


def test_fresh_run_export_copies_the_shipped_tokenizer(tmp_path):
    from jaxrl_agents.chat import load_tiny_tokenizer, tiny_tokenizer_path
    from jaxrl_agents.jobs.config import RunConfig
    from jaxrl_agents.jobs.export import export_policy

    export_policy(_fresh_model(), load_tiny_tokenizer(), RunConfig(), tmp_path)
    assert _dtypes(tmp_path) == {"torch.float32"}  # a fresh model: its param_dtype
    shipped = _tokenizer_files(tiny_tokenizer_path())
    assert set(shipped) <= set(TOKENIZER_FILES)
    assert _tokenizer_files(tmp_path) == shipped
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2


def test_run_export_lists_every_stop_id_of_the_chat_format(tmp_path):
    """A base-model tokenizer (eos ``<|endoftext|>``) whose template ends turns with
    ``<|im_end|>``: both end generation, and its files are copied as they are."""
    from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
    from jaxrl_agents.jobs.build import build_tokenizer
    from jaxrl_agents.jobs.config import ChatSpec, RunConfig
    from jaxrl_agents.jobs.export import export_policy

    base = load_tiny_tokenizer(cached=False)
    base.eos_token = "<|endoftext|>"
    base.save_pretrained(tmp_path / "tok")
    run_cfg = RunConfig(chat=ChatSpec(tokenizer=str(tmp_path / "tok")))
    tok = build_tokenizer(run_cfg.chat, None)
    assert tok.eos_token_id == 0 and ChatFormat(tok).stop_token_ids[:2] == [2, 0]
    export_policy(_fresh_model(), tok, run_cfg, tmp_path / "out")
    gen = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert gen["eos_token_id"][:2] == [0, 2]
    assert set(gen["eos_token_id"]) == set(ChatFormat(tok).stop_token_ids)
    assert _tokenizer_files(tmp_path / "out") == _tokenizer_files(tmp_path / "tok")


def _cli(module, argv, monkeypatch) -> int:
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    try:
        module.main()
    except SystemExit as e:
        return e.code
    return 0


def test_train_then_jaxrl_export_is_faithful_to_the_source(source, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from jaxrl_agents.cli import export as export_cli
    from jaxrl_agents.cli import train as train_cli
    from jaxrl_agents.jobs.build import generation_defaults
    from jaxrl_agents.jobs.restore import load_policy, load_run_config

    run = tmp_path / "run"
    argv = ["model=hf", f"model.path={source}", "model.dtype=float32", "model.param_dtype=float32",
            "model.remat=false", "trainer=smoke", "sampler.max_slots=16", "rollout.group_size=2",
            "mesh=single", "trainer.eval.heldout_tasks=2", "trainer.rl.steps=1",
            "trainer.checkpoint.export=false", f"run_dir={run}"]  # fmt: skip
    assert _cli(train_cli, argv, monkeypatch) == 0
    assert _cli(export_cli, [f"run_dir={run}"], monkeypatch) == 0
    out = run / "hf_export_latest"
    policy, _, _ = load_policy(run)
    assert policy.cfg.param_dtype == "float32"

    assert _dtypes(out) == {"torch.bfloat16"}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    got = _state(out)
    for name, arr in hf_tensors(policy, dtype="bfloat16"):  # the trained weights, rounded
        assert got[name].view(torch.int16).numpy().tobytes() == arr.tobytes(), name
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and gen["repetition_penalty"] == 1.05
    for k, v in generation_defaults(load_run_config(run).rollout).items():
        assert gen[k] == v, k
    assert _tokenizer_files(out) == _tokenizer_files(source)
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16

    assert _cli(export_cli, [f"run_dir={run}", "dtype=float32", f"out={tmp_path}/f32"],
                monkeypatch) == 0  # fmt: skip
    assert _dtypes(tmp_path / "f32") == {"torch.float32"}
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["torch_dtype"] == "float32"
    got = _state(tmp_path / "f32")
    for name, arr in hf_tensors(policy):
        np.testing.assert_array_equal(got[name].numpy(), arr, err_msg=name)
