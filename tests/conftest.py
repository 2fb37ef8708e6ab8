"""Test-wide setup: 8 simulated CPU devices (must be set before JAX initialises)."""

import os

# The suite's programs are tiny and each is run a few times: compiling them with little
# optimisation halves the suite's compile time (most of its wall time on 2 cores).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
# for the jobs tests start as subprocesses, on one (simulated) device
os.environ.setdefault(
    "JAXRL_TEST_XLA_FLAGS_ONE_DEVICE", f"--xla_force_host_platform_device_count=1 {FAST_COMPILE}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    """Share compiled programs between the many small jobs the suite runs in-process, between
    xdist workers, and with the jobs tests start as subprocesses (a killed run and its resume, the
    processes of a multi-host run: the environment carries the setting to them): JAX's persistent
    compilation cache, kept in a folder per checkout."""
    import jax

    cache = os.environ.get("JAXRL_TEST_COMPILE_CACHE") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax"
    )
    settings = {
        "jax_compilation_cache_dir": cache,
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    for name, value in settings.items():
        jax.config.update(name, value)
        os.environ[name.upper()] = str(value)  # read by JAX in every subprocess the tests start


# -- tokenizer folders laid out like real model families' (no download) ----------------------------

import json  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"

FAMILIES = {
    # family: (template file, added special tokens, added plain tokens, bos, eos, eos list names)
    "qwen2.5": ("qwen2.5-instruct.jinja", [], [], None, "<|im_end|>",
                ["<|im_end|>", "<|endoftext|>"]),
    "qwen3": ("qwen3.jinja", [], ["<think>", "</think>"], None, "<|im_end|>",
              ["<|im_end|>", "<|endoftext|>"]),
    "llama3.1": ("llama3.1-instruct.jinja",
                 ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
                 [], "<|begin_of_text|>", "<|eot_id|>",
                 ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),
}  # fmt: skip


def make_family_tokenizer(family: str, folder: pathlib.Path) -> pathlib.Path:
    """The shipped tiny BPE with ``family``'s real chat template and the special tokens it
    names, saved as a tokenizer folder with a ``generation_config.json`` eos list like the
    hub's (``chat.tokenizer=<folder>``)."""
    from jaxrl_agents.chat import load_tiny_tokenizer

    tpl, special, plain, bos, eos, eos_list = FAMILIES[family]
    tok = load_tiny_tokenizer(cached=False)
    if special:
        tok.add_special_tokens({"additional_special_tokens": special})
    if plain:
        tok.add_tokens(plain)
    if bos:
        tok.bos_token = bos
    tok.eos_token = eos
    tok.chat_template = (TEMPLATES / tpl).read_text()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    ids = [tok.convert_tokens_to_ids(t) for t in eos_list]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return folder


@pytest.fixture(scope="session")
def family_tokenizer(tmp_path_factory):
    """``family -> tokenizer folder`` (built once per session)."""
    made: dict[str, pathlib.Path] = {}

    def get(family: str) -> pathlib.Path:
        if family not in made:
            made[family] = make_family_tokenizer(family, tmp_path_factory.mktemp(family))
        return made[family]

    return get
