"""The model judge (``rollout.model_judge``) behind a model-free scripted engine: a valid judgment
is the parsed score, a malformed one is that episode's counted reward error, identical requests
are sampled once, and ``on: trajectory`` shows the judge the tool calls."""

from __future__ import annotations

import asyncio

import pytest

from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
from jaxrl_agents.rewards import JUDGE_FAILURES, RewardComposer, RewardConfig
from jaxrl_agents.rollout import ScriptedEngine
from jaxrl_agents.rollout.model_judge import JudgmentError, ModelJudge, parse_score
from jaxrl_agents.rollout.orchestrator import score_episode
from jaxrl_agents.types import EndReason, Task, ToolCall, ToolResult, Trajectory, Turn


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(load_tiny_tokenizer())


def episode(question: str, answer: str, *, tool: bool = True) -> Trajectory:
    call = ToolCall(name="calc", arguments={"expression": "6*7"})
    turns = [
        Turn(
            index=0,
            start=0,
            end=4,
            text="let me compute",
            tool_calls=[call] if tool else [],
            tool_results=[ToolResult(call=call, content="42")] if tool else [],
        ),
        Turn(index=1, start=4, end=8, text=answer),
    ]
    return Trajectory(
        task=Task(question, "toy", "train", {}),
        messages=[{"role": "user", "content": question}],
        tools=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        prompt_len=0,
        turns=turns,
        end_reason=EndReason.ANSWERED,
    )


class Grader:
    """A scripted judge model: its reply per episode, chosen by the question in the prompt."""

    def __init__(self, replies: dict[str, str]):
        self.replies, self.prompts = replies, []

    def __call__(self, messages):
        prompt = messages[-1]["content"]
        self.prompts.append(prompt)
        reply = next(r for q, r in self.replies.items() if q in prompt)
        return {"role": "assistant", "content": reply}


def judged(chat, replies, **kw) -> tuple[ModelJudge, Grader]:
    grader = Grader(replies)
    return ModelJudge(chat, ScriptedEngine(chat, policy=grader), **kw), grader


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("The answer is right.\nSCORE: 8", 8.0),
        ("score = 2.5", 2.5),
        ("**Score:** 10", 10.0),
        ("Reasons.\nScore is 0", 0.0),
        ("SCORE: 3\nthinking again... SCORE: 6", 6.0),
        ("fine\n7/10", 7.0),
    ],
)
def test_parse_score_tolerant_spellings(text, score):
    assert parse_score(text, 0, 10) == score


@pytest.mark.parametrize("text", ["", "no idea", "SCORE: 11", "SCORE: -1", "SCORE: high"])
def test_parse_score_rejects_missing_out_of_range_and_non_numeric(text):
    with pytest.raises(JudgmentError):
        parse_score(text, 0, 10)


def test_a_valid_judgment_is_the_parsed_score_on_the_scale(chat):
    judge, grader = judged(chat, {"What is 6*7?": "Correct.\nSCORE: 8"}, scale=(0, 10))
    assert asyncio.run(judge(episode("What is 6*7?", "42"))) == pytest.approx(0.8)
    assert "FINAL ANSWER:\n42" in grader.prompts[0] and "Rubric:" in grader.prompts[0]
    assert judge.stats.take() == {
        "judge/calls": 1.0,
        "judge/cache_hits": 0.0,
        "judge/errors": 0.0,
        "judge/s": pytest.approx(judge.stats.seconds, abs=1.0),
    }
    assert judge.stats.calls == 0  # take() zeroes the counts


def test_malformed_judgments_are_that_episodes_reward_errors_only(chat):
    replies = {"q-good": "SCORE: 9", "q-garbage": "banana banana", "q-high": "SCORE: 42"}
    judge, _ = judged(chat, replies)
    cfg = RewardConfig.from_dict(
        {"terms": [{"name": "outcome"}, {"name": "judge", "params": {"name": "model"}}]}
    )
    composer = RewardComposer(cfg, judges={"model": judge})
    trajs = [episode(q, "42") for q in replies]

    async def score_all():
        await asyncio.gather(*(score_episode(composer.acompute, t) for t in trajs))

    asyncio.run(score_all())
    good, garbage, high = trajs
    assert good.end_reason == EndReason.ANSWERED
    assert good.reward_terms["judge"] == pytest.approx(0.9)
    for bad in (garbage, high):
        assert bad.end_reason == EndReason.REWARD_ERROR and bad.reward == 0.0
        assert "JudgmentError" in bad.error
    assert judge.stats.errors == 2 and judge.stats.calls == 3


def test_on_error_zero_scores_a_malformed_judgment_zero_and_counts_it(chat):
    judge, _ = judged(chat, {"q": "I cannot say."})
    cfg = RewardConfig.from_dict(
        {"terms": [{"name": "judge", "params": {"name": "zeroed", "on_error": "zero"}}]}
    )
    before = JUDGE_FAILURES.get("zeroed", 0)
    out = asyncio.run(RewardComposer(cfg, judges={"zeroed": judge}).acompute(episode("q", "1")))
    assert out.total == 0.0 and JUDGE_FAILURES["zeroed"] == before + 1
    assert judge.stats.errors == 1


def test_an_identical_request_is_a_cache_hit(chat):
    judge, grader = judged(chat, {"What is 6*7?": "SCORE: 5"})
    a, b = episode("What is 6*7?", "42"), episode("What is 6*7?", "42")

    async def both():
        return await judge(a), await judge(b), await judge(episode("What is 6*7?", "41"))

    assert asyncio.run(both()) == (0.5, 0.5, 0.5)
    assert len(grader.prompts) == 2  # the engine saw the first and the different answer only
    assert (judge.stats.calls, judge.stats.cache_hits) == (2, 1)


def test_concurrent_identical_requests_share_one_sample(chat):
    judge, grader = judged(chat, {"q": "SCORE: 10"})

    async def many():
        return await asyncio.gather(*(judge(episode("q", "x")) for _ in range(4)))

    assert asyncio.run(many()) == [1.0] * 4
    assert len(grader.prompts) == 1 and judge.stats.cache_hits == 3


def test_a_timed_out_shared_judgment_is_an_error_of_the_sharers_not_their_cancellation(chat):
    grader = Grader({"q": "SCORE: 2"})
    judge = ModelJudge(chat, ScriptedEngine(chat, policy=grader, latency_s=0.5))

    async def race():
        first = asyncio.ensure_future(asyncio.wait_for(judge(episode("q", "x")), 0.05))
        await asyncio.sleep(0.01)  # the first is sampling: the second shares its judgment
        second = asyncio.ensure_future(judge(episode("q", "x")))
        return await asyncio.gather(first, second, return_exceptions=True)

    first, second = asyncio.run(race())
    assert isinstance(first, TimeoutError)
    assert isinstance(second, RuntimeError) and "cancelled" in str(second)


def test_without_cache_every_request_is_sampled(chat):
    judge, grader = judged(chat, {"q": "SCORE: 1"}, cache=False)
    asyncio.run(judge(episode("q", "x")))
    asyncio.run(judge(episode("q", "x")))
    assert len(grader.prompts) == 2 and judge.stats.cache_hits == 0


def test_on_trajectory_renders_the_tool_calls_and_results(chat):
    judge, grader = judged(chat, {"What is 6*7?": "SCORE: 7"}, on="trajectory")
    asyncio.run(judge(episode("What is 6*7?", "The answer is 42")))
    prompt = grader.prompts[0]
    assert 'TOOL CALL: calc({"expression": "6*7"})' in prompt
    assert "TOOL RESULT (calc):\n42" in prompt
    assert "let me compute" in prompt and "The answer is 42" in prompt
    judge_a, grader_a = judged(chat, {"What is 6*7?": "SCORE: 7"}, on="answer")
    asyncio.run(judge_a(episode("What is 6*7?", "The answer is 42")))
    assert "TOOL CALL" not in grader_a.prompts[0]


def test_a_long_episode_is_cut_to_max_prompt_tokens(chat):
    judge, _ = judged(chat, {"q": "SCORE: 3"}, on="trajectory", max_prompt_tokens=300)
    long = episode("q", "word " * 2000)
    ids = judge.prompt_ids(long)
    assert len(ids) <= 300
    assert "tokens cut" in chat.tokenizer.decode(ids)
    assert asyncio.run(judge(long)) == pytest.approx(0.3)


def test_a_judge_without_an_engine_is_an_error_not_a_hang(chat):
    judge = ModelJudge(chat)
    with pytest.raises(RuntimeError, match="no engine"):
        asyncio.run(judge(episode("q", "x")))
    assert judge.stats.errors == 1


def test_bad_settings_name_the_setting(chat):
    with pytest.raises(ValueError, match="on='turns'"):
        ModelJudge(chat, on="turns")
    with pytest.raises(ValueError, match="scale"):
        ModelJudge(chat, scale=(5, 5))
