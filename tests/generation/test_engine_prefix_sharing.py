"""Shared prompt prefixes (fork) and chunked prefill give the results of plain prefill."""

import asyncio
import dataclasses

import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams
from jaxrl_agents.models import ModelConfig, Transformer

CFG = ModelConfig(
    model_type="qwen2",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
)
ENGINE = EngineConfig(
    max_slots=8, max_seq_len=192, prefill_buckets=(8, 32), decode_chunk=4, share_min_tokens=16
)
LATE = ("P", "ext", "sys", "short")
GREEDY = dict(temperature=0.0)
SAMPLED = dict(temperature=0.9, top_p=0.95)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(1))


def assert_same(got: dict, ref: dict, atol: float) -> None:
    assert got.keys() == ref.keys()
    for name in ref:
        for a, b in zip(got[name], ref[name], strict=True):
            assert a.token_ids == b.token_ids, name
            assert a.finish_reason == b.finish_reason, name
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=atol, rtol=0, err_msg=name)
            assert (a.sampling_logprobs is None) == (b.sampling_logprobs is None)
            if a.sampling_logprobs is not None:
                np.testing.assert_allclose(
                    a.sampling_logprobs, b.sampling_logprobs, atol=atol, rtol=0, err_msg=name
                )


def prompts():
    rng = np.random.default_rng(0)
    p = rng.integers(1, 128, 70).tolist()  # body 69 tokens: two fork blocks of 64 (one clamped)
    sys_only = p[:24] + [(p[24] + 1) % 128] + rng.integers(1, 128, 29).tolist()
    return {
        "P": p,
        "ext": p + rng.integers(1, 128, 12).tolist(),  # extends P: shares P's whole body
        "sys": sys_only,  # shares P's first 24 tokens (a system prompt), then differs
        "short": p[:10],  # below share_min_tokens: prefilled in full
    }


def group_scenario(engine: Engine, kind: dict) -> dict:
    """4 sessions of one prompt (3 turns with tool results each); once they are past turn 2, a
    late session of the same prompt (forks from a live slot that has generated further turns),
    one that extends it, one sharing only its system prompt, and a short one."""
    ps = prompts()
    late_go, late_done = asyncio.Event(), asyncio.Event()
    past_turn2: list[int] = []
    out: dict[str, list] = {}

    async def member(i):
        rng = np.random.default_rng(10 + i)
        s = await engine.open_session()
        res, new = [], ps["P"]
        for turn in range(3):
            sp = SamplingParams(**kind, max_new_tokens=6, seed=i)
            res.append(await s.generate(new, sp))
            new = rng.integers(1, 128, 5 + i).tolist()  # a tool result
            if turn == 1:
                past_turn2.append(i)
                if len(past_turn2) == 4:
                    late_go.set()
        out[f"group{i}"] = res
        await late_done.wait()  # the late sessions fork from these live slots
        await s.close()

    async def late(name, seed):
        await late_go.wait()
        s = await engine.open_session()
        sp = SamplingParams(**kind, max_new_tokens=6, seed=seed)
        r1 = await s.generate(ps[name], sp)
        r2 = await s.generate([7, 8, 9], sp)
        out["late_" + name] = [r1, r2]
        await s.close()

    async def run():
        async with engine:
            lates = asyncio.gather(*(late(n, 20 + k) for k, n in enumerate(LATE)))
            members = asyncio.gather(*(member(i) for i in range(4)))
            await lates
            late_done.set()  # the group closes after the late sessions are done
            await members

    asyncio.run(run())
    return out


@pytest.mark.parametrize(
    "kind,unroll",
    [(GREEDY, True), (SAMPLED, True), (SAMPLED, False)],
    ids=["greedy", "sampled", "sampled-stacked"],
)
def test_shared_prefixes_give_unshared_results(model, kind, unroll):
    shared = Engine(model, dataclasses.replace(ENGINE, unroll_layers=unroll))
    plain = Engine(model, dataclasses.replace(ENGINE, unroll_layers=unroll, share_prefixes=False))
    got, ref = group_scenario(shared, kind), group_scenario(plain, kind)
    assert_same(got, ref, atol=1e-6)
    # 3 group followers + the late P session fork all 69 body tokens, "ext" forks 69 and
    # prefills the rest, "sys" forks its 24 common tokens, "short" forks nothing.
    assert shared.stats["forks"] == 6 and plain.stats["forks"] == 0
    assert shared.stats["shared_tokens"] == 5 * 69 + 24
    total = shared.stats["prefill_tokens"] + shared.stats["shared_tokens"]
    assert total == plain.stats["prefill_tokens"]
    assert shared._prefixes.empty  # all released


def test_forks_compile_nothing_after_warmup(model):
    eng = Engine(model, ENGINE)

    def round_(seed):
        rng = np.random.default_rng(seed)
        base = rng.integers(1, 128, 40).tolist()
        groups = [base, rng.integers(1, 128, 70).tolist(), base + rng.integers(1, 128, 9).tolist()]
        sp = [SamplingParams(max_new_tokens=5, seed=k) for k in range(3)]

        async def episode(prompt, k):
            s = await eng.open_session()
            await s.generate(prompt, sp[k % 3])
            await s.generate(rng.integers(1, 128, 4).tolist(), sp[k % 3])
            await s.close()

        async def main():
            async with eng:
                await asyncio.gather(
                    *(episode(g, k) for g in groups for k in range(2 if g is groups[2] else 3))
                )

        eng.reset_stats()
        asyncio.run(main())
        return dict(eng.stats)

    first = round_(0)
    assert first["forks"] >= 5
    before = eng.compile_count
    for seed in (1, 2):
        stats = round_(seed)
        assert stats["forks"] == first["forks"] and stats["shared_tokens"] > 0
    assert eng.compile_count == before


def test_update_weights_makes_prefixes_stale(model):
    eng = Engine(model, ENGINE)
    other = Transformer(CFG, rngs=nnx.Rngs(5))
    ref_eng = Engine(other, dataclasses.replace(ENGINE, share_prefixes=False))
    p = prompts()["P"]
    sp = SamplingParams(temperature=0.0, max_new_tokens=5)
    (ref,) = ref_eng.generate_batch([p], sp)

    async def main():
        async with eng:
            a = await eng.open_session()
            await a.generate(p, sp)  # a's slot holds P under the old weights
            eng.update_weights(other)
            b = await eng.open_session()
            res = await b.generate(p, sp)
            c = await eng.open_session()  # b's prefix (new weights) is shared again
            res_c = await c.generate(p, sp)
            for s in (a, b, c):
                await s.close()
            return res, res_c

    res, res_c = asyncio.run(main())
    assert res.token_ids == ref.token_ids and res_c.token_ids == ref.token_ids
    np.testing.assert_allclose(res.logprobs, ref.logprobs, atol=1e-6)
    assert eng.stats["forks"] == 1  # c from b, never b from a


def chunked_scenario(engine: Engine):
    """Two sessions decode long turns; a 100-token prompt arrives while they run."""
    rng = np.random.default_rng(3)
    events = []
    inner_prefill, inner_decode = engine._prefill, engine._run_decode

    def prefill(state, cache, tokens, n_valid, lengths, rows):
        events.append(("P", int(n_valid.sum())))
        return inner_prefill(state, cache, tokens, n_valid, lengths, rows)

    def decode(*args):
        events.append(("D", 0))
        return inner_decode(*args)

    engine._prefill, engine._run_decode = prefill, decode
    short = [[int(t)] for t in rng.integers(1, 128, 2)]  # nothing to prefill: decoding at once
    long = rng.integers(1, 128, 101).tolist()
    out = {}

    async def runner(i):
        s = await engine.open_session()
        sp = SamplingParams(temperature=1.0, max_new_tokens=60, seed=i)
        out[f"run{i}"] = [await s.generate(short[i], sp)]
        await s.close()

    async def arrival():
        while engine.stats["decode_dispatches"] < 3:  # the runners are decoding
            await asyncio.sleep(0.001)
        s = await engine.open_session()
        sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=9)
        out["long"] = [await s.generate(long, sp)]
        out["long"].append(await s.generate([4, 5, 6], sp))
        await s.close()

    async def main():
        async with engine:
            await asyncio.gather(runner(0), runner(1), arrival())

    asyncio.run(main())
    return out, events


def test_chunked_prefill_interleaves_and_matches(model):
    cfg = dataclasses.replace(ENGINE, decode_chunk=2, share_prefixes=False)
    chunked = Engine(model, dataclasses.replace(cfg, prefill_chunk_tokens=16))
    whole = Engine(model, dataclasses.replace(cfg, prefill_chunk_tokens=None))
    got, ev = chunked_scenario(chunked)
    ref, ev_ref = chunked_scenario(whole)
    assert_same(got, ref, atol=1e-5)

    def long_span(events):  # the events from the long prompt's first to its last piece
        first = next(i for i, (k, n) in enumerate(events) if k == "P" and n > 0)
        last, total = first, 0
        while total < 100:
            total += events[last][1]
            last += 1
        return events[first:last]

    span = long_span(ev)
    pieces = [n for k, n in span if k == "P"]
    assert sum(pieces) == 100 and max(pieces) <= 16 and len(pieces) == 7
    assert sum(k == "D" for k, _ in span) >= 6  # a decode chunk between every two pieces
    span = long_span(ev_ref)
    assert [k for k, _ in span] == ["P"] * 4  # 32 + 32 + 32 + 4, no decode in between
    assert chunked.stats["max_token_gap_s"] > 0


def test_cancelled_leader_followers_recover(model):
    """The leader of a group is cancelled halfway through its chunked prefill: its followers
    find another source (one of them becomes the leader) and give the unshared results."""
    cfg = dataclasses.replace(ENGINE, decode_chunk=2, prefill_chunk_tokens=16)
    p = np.random.default_rng(4).integers(1, 128, 90).tolist()

    def run(engine, cancel):
        out = {}

        async def runner():
            s = await engine.open_session()
            out["run"] = await s.generate([1, 2, 3], SamplingParams(max_new_tokens=60, seed=1))
            await s.close()

        async def member(i):
            s = await engine.open_session()
            try:
                out[i] = await s.generate(p, SamplingParams(max_new_tokens=6, seed=i))
            finally:
                await s.close()

        async def main():
            async with engine:
                run_task = asyncio.create_task(runner())
                while engine.stats["decode_dispatches"] < 2:
                    await asyncio.sleep(0.001)
                tasks = [asyncio.create_task(member(i)) for i in range(3)]
                if cancel:
                    while not any(e.written for e in engine._prefixes.entries.values()):
                        await asyncio.sleep(0.0005)
                    tasks[0].cancel()
                done = await asyncio.gather(*tasks, return_exceptions=True)
                await run_task
                return done

        done = asyncio.run(main())
        return out, done

    eng = Engine(model, cfg)
    got, done = run(eng, cancel=True)
    assert isinstance(done[0], asyncio.CancelledError)
    # The second member became the leader; the third forked from it, not from the cancelled one.
    assert eng.stats["forks"] == 1 and eng.stats["shared_tokens"] == 89
    ref, _ = run(Engine(model, dataclasses.replace(cfg, share_prefixes=False)), cancel=False)
    for key in ("run", 1, 2):
        assert got[key].token_ids == ref[key].token_ids
        np.testing.assert_allclose(got[key].logprobs, ref[key].logprobs, atol=1e-5)
