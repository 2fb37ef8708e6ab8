#!/usr/bin/env python
"""Build the tiny byte-level BPE tokenizer shipped in ``jaxrl_agents/assets/tiny_tokenizer/``.

The tokenizer exists so the demo and the tests need no download. It is a byte-level BPE (any text
encodes), with digits split one per token (a tiny model must copy numbers digit by digit), trained
on a deterministic synthetic corpus generated here: conversations rendered with the shipped chat
template (tool schemas, tool calls, tool results), arithmetic word problems, SQL, travel and
research vocabulary, and plain English filler. Output is Hugging Face format
(``tokenizer.json``, ``tokenizer_config.json`` with the chat template, ``special_tokens_map.json``),
loadable offline with ``transformers.AutoTokenizer.from_pretrained``. Same arguments ->
byte-identical files (a test rebuilds and compares them with the shipped ones).

Run:  python scripts/build_tiny_tokenizer.py [--out DIR] [--vocab-size 1280] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without an installed package
    sys.path.insert(0, str(REPO))

from jaxrl_agents.chat.templates import TINY_CHAT_TEMPLATE, render_template  # noqa: E402

DEFAULT_OUT = REPO / "jaxrl_agents" / "assets" / "tiny_tokenizer"
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SPECIAL = [PAD, IM_START, IM_END]  # ids 0, 1, 2; the tool tags follow as ids 3-6
MODEL_MAX_LENGTH = 2048

NAMES = "Tom Anna Ben Mia Sam Lily Max Emma Leo Zoe Noah Ava Jack Nora Liam Ruth".split()
OBJECTS = (
    "apples pens books marbles cookies stickers cards boxes coins shells eggs balls toys "
    "flowers candies pencils bottles cups plates shirts"
).split()
FILLER = (
    "the a an of to and in is it that for on with as at by from this be are was have not but "
    "what all were when we there can your which their said if do will each about how up out "
    "them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "good new write our me man too any day same right look think also around another came come "
    "work three word must because does part even place well such here take why help put years "
    "different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end "
    "along while might next sound below saw something thought both few those always show large "
    "often together asked house world going want school important until form food keep children "
    "feet land side without boy once animal life enough took four head above kind began almost "
    "live page got earth need far hand high year mother light country father let night picture "
    "being study second soon story since white ever paper hard near sentence better best across "
    "during today however sure knew try told young sun thing whole hear example heard several "
    "change answer room sea against top turned learn point city play toward five himself usually "
    "money seen car morning yes please thanks sorry result total error invalid found missing"
).split()
SQL = (
    "SELECT FROM WHERE GROUP BY ORDER LIMIT COUNT SUM AVG MIN MAX JOIN ON AS AND OR NOT IN "
    "DISTINCT HAVING DESC ASC LEFT INNER LIKE BETWEEN NULL IS INSERT UPDATE DELETE DROP TABLE "
    "PRAGMA ATTACH customers orders products order_id customer_id product_id price quantity "
    "amount total country city email created_at status category name id"
).split()
TRAVEL = (
    "flight hotel booking book cancel itinerary budget checkin checkout origin dest date night "
    "nights price total available airport departure arrival Paris London Berlin Rome Madrid "
    "Tokyo Boston Denver Lisbon Vienna Oslo Prague confirmed cancelled overlap exceeded"
).split()
RESEARCH = (
    "search open document doc source sources founder founded born company city river mountain "
    "museum university author wrote book invented discovered capital located river year "
    "according cites evidence query results title snippet"
).split()


def _tool(name: str, desc: str, params: dict[str, str]) -> dict:
    props = {p: {"type": t} for p, t in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": list(params)},
        },
    }


TOOLS = {
    "calculator": [
        _tool("calculator", "Evaluate an arithmetic expression.", {"expression": "string"})
    ],
    "sql": [
        _tool("list_tables", "List the tables.", {}),
        _tool("describe_table", "Show the columns of a table.", {"name": "string"}),
        _tool("run_sql", "Run a read-only SQL query.", {"query": "string"}),
    ],
    "research": [
        _tool("search", "Search the documents.", {"query": "string", "k": "integer"}),
        _tool("open", "Open a document by id.", {"doc_id": "string"}),
    ],
    "travel": [
        _tool(
            "search_flights",
            "Find flights.",
            {"origin": "string", "dest": "string", "date": "string"},
        ),
        _tool(
            "search_hotels",
            "Find hotels.",
            {"city": "string", "checkin": "string", "checkout": "string"},
        ),
        _tool("book_flight", "Book a flight.", {"id": "string"}),
        _tool("book_hotel", "Book a hotel.", {"id": "string"}),
        _tool("cancel", "Cancel a booking.", {"booking_id": "string"}),
        _tool("get_itinerary", "Show bookings.", {}),
    ],
}


def _call(name: str, **arguments: object) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _word_problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, expression, answer) in the calculator environment's style."""
    who, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 99)
    kind = rng.randrange(4)
    if kind == 0:
        giver = rng.choice(NAMES)
        q = f"{who} has {a} {obj}. {giver} gives {who} {b} more. How many {obj} does {who} have?"
        return q, f"{a}+{b}", a + b
    if kind == 1:
        q = f"{who} has {a + b} {obj} and gives away {b}. How many {obj} are left?"
        return q, f"{a + b}-{b}", a
    if kind == 2:
        q = f"There are {a} boxes with {b} {obj} each. How many {obj} are there in total?"
        return q, f"{a}*{b}", a * b
    q = (
        f"{who} has {a} boxes with {b} {obj} each. {who} gives away {c} {obj}. "
        f"How many {obj} does {who} have?"
    )
    return q, f"{a}*{b}-{c}", a * b - c


def _conversation(rng: random.Random) -> tuple[list[dict], list[dict]]:
    env = rng.choice(list(TOOLS))
    system = rng.choice(
        ["Use the tools. Answer with a number.", "You are a helpful assistant.", ""]
    )
    if env == "calculator":
        q, expr, ans = _word_problem(rng)
        turns = [("calculator", {"expression": expr}, str(ans))]
        final = rng.choice([str(ans), f"The answer is {ans}."])
    elif env == "sql":
        table = rng.choice(["customers", "orders", "products"])
        query = (
            f"SELECT COUNT(*) FROM {table} WHERE {rng.choice(SQL[-12:])} > {rng.randint(1, 500)}"
        )
        q = f"How many {table} match? Use the database."
        n = rng.randint(0, 999)
        turns = [
            ("list_tables", {}, "customers, orders, products"),
            ("run_sql", {"query": query}, f"[[{n}]]"),
        ]
        final = str(n)
    elif env == "research":
        topic = " ".join(rng.sample(RESEARCH, 3))
        doc = f"doc_{rng.randint(0, 199)}"
        q = f"Which city was the founder of {rng.choice(NAMES)} Labs born in?"
        turns = [
            ("search", {"query": topic, "k": rng.randint(1, 5)}, f"{doc}: {topic}"),
            ("open", {"doc_id": doc}, " ".join(rng.choices(FILLER + RESEARCH, k=12))),
        ]
        final = f"{rng.choice(TRAVEL[20:32])} [{doc}]"
    else:
        src, dst = rng.sample(TRAVEL[20:32], 2)
        date = f"2025-0{rng.randint(1, 9)}-{rng.randint(10, 28)}"
        fid = f"F{rng.randint(100, 999)}"
        q = f"Book a flight from {src} to {dst} on {date} under {rng.randint(100, 900)} dollars."
        turns = [
            (
                "search_flights",
                {"origin": src, "dest": dst, "date": date},
                f"{fid} price {rng.randint(50, 900)}",
            ),
            ("book_flight", {"id": fid}, f"booked B{rng.randint(1, 99)}"),
        ]
        final = f"Booked {fid}."
    messages: list[dict] = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": q}
    ]
    for name, args, result in turns:
        content = rng.choice(["", "", "Let me check."])
        messages.append(
            {"role": "assistant", "content": content, "tool_calls": [_call(name, **args)]}
        )
        messages.append({"role": "tool", "name": name, "content": result})
    messages.append({"role": "assistant", "content": final})
    return messages, TOOLS[env]


def corpus(*, seed: int, n_conversations: int = 3000, n_filler: int = 3000) -> list[str]:
    """Deterministic training corpus (a list of documents)."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_conversations):
        messages, tools = _conversation(rng)
        docs.append(render_template(TINY_CHAT_TEMPLATE, messages, tools=tools))
    for _ in range(n_filler):
        words = rng.choices(FILLER, k=rng.randint(8, 20)) + rng.sample(SQL + TRAVEL + RESEARCH, 3)
        rng.shuffle(words)
        docs.append(" ".join(words).capitalize() + rng.choice([".", "?", "!"]))
        docs.append(_word_problem(rng)[0])
    return docs


def build(out_dir: Path, *, vocab_size: int = 1280, seed: int = 0) -> Path:
    """Train the tokenizer and write the three Hugging Face files into ``out_dir``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # Registered before training so the corpus' markup is split out and never merged into BPE.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL + TOOL_TAGS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed=seed), trainer=trainer)
    # The trainer re-registers its special_tokens as special: restore the tool tags' flag (as in
    # Qwen2.5, they survive decode(skip_special_tokens=True)).
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    ids = {t: tok.token_to_id(t) for t in SPECIAL + TOOL_TAGS}
    if list(ids.values()) != list(range(len(ids))):
        raise RuntimeError(f"special token ids moved: {ids}")

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL,
        }
        for t, i in ids.items()
    }
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": TINY_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    special_map = {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": IM_END,
        "pad_token": PAD,
    }
    for name, obj in [("tokenizer_config.json", config), ("special_tokens_map.json", special_map)]:
        (out_dir / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)"
    )
    p.add_argument(
        "--vocab-size", type=int, default=1280, help="total vocabulary incl. special tokens"
    )
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    args = p.parse_args(argv)
    out = build(args.out, vocab_size=args.vocab_size, seed=args.seed)
    from tokenizers import Tokenizer

    n = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    print(f"wrote {out} (vocab {n})")


if __name__ == "__main__":
    main()
