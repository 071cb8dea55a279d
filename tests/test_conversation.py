"""One turn loop for both kinds of policy: token ids (`TokenDialogue`) or chat messages."""

from __future__ import annotations

import pytest

from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, PolicyError, RolloutEngine, RolloutSettings
from agentgym_core.rollout.text import ContextWindowExceeded, TextRolloutEngine
from agentgym_core.types import Generation, StepResult, Termination

ACTION = "wait"


class CountingEnv:
    """Ends after `done_after` steps (never when None), whatever the action."""

    def __init__(self, done_after: int | None = None) -> None:
        self.done_after, self.steps = done_after, 0

    def tasks(self, split):
        return [0, 1, 2]

    def instruction(self):
        return "Wait until the bell rings."

    def reset(self, task_id):
        self.steps = 0
        return f"Task {task_id}: the bell is silent."

    def step(self, action):
        self.steps += 1
        done = self.steps == self.done_after
        return StepResult(f"Step {self.steps}: you {action}.", float(done), done)

    def valid_actions(self):
        return [ACTION, "look"]

    def task_group(self, task_id):
        return "all"

    def close(self):
        pass


class TokenPolicy:
    """Token level: always samples `ACTION`, each token at log-prob -0.5; records the seeds."""

    def __init__(self, chat: ChatFormat, fail: bool = False) -> None:
        self.tokenizer, self.chat, self.fail = chat.tokenizer, chat, fail
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids, params, allowed_actions=None, *, session=None):
        if self.fail:
            raise RuntimeError("device lost")
        self.seeds.append(params.seed)
        ids = self.chat.action_ids(ACTION)
        return Generation(ids, [-0.5] * len(ids), ACTION, [None] * len(ids))

    def close(self):
        pass


class TextPolicy:
    """Text level: answers `ACTION`; refuses conversations longer than `max_messages`."""

    text_level = True

    def __init__(self, max_messages: int = 1000, fail: bool = False) -> None:
        self.max_messages, self.fail = max_messages, fail
        self.seeds: list[int | None] = []
        self.aclosed = 0

    async def chat(self, messages, params, allowed_actions=None):
        if self.fail:
            raise RuntimeError("HTTP 401")
        if len(messages) > self.max_messages:
            raise ContextWindowExceeded("too long")
        self.seeds.append(params.seed)
        return ACTION

    async def aclose(self):
        self.aclosed += 1

    def close(self):
        pass


def _chat(tiny_model) -> ChatFormat:
    model, tokenizer = tiny_model
    return ChatFormat(tokenizer, model.generation_config)


def _play(engine, settings):
    try:
        return engine.run([EpisodeSpec(task, group=task) for task in range(3)], settings)
    finally:
        engine.close()


def _token_budget(chat: ChatFormat, settings: RolloutSettings) -> int:
    """A context that holds the prompt and one action, but not an observation after it."""
    env = CountingEnv()
    prompt = chat.prompt_ids(env.instruction(), env.reset(2))
    return len(prompt) + max(settings.max_new_tokens, len(chat.action_ids(ACTION)))


@pytest.mark.parametrize(
    ("done_after", "turns", "context", "termination"),
    [
        (None, 3, False, Termination.HORIZON),
        (2, 2, False, Termination.DONE),
        (None, 1, True, Termination.CONTEXT_BUDGET),
    ],
)
def test_token_and_text_policies_end_episodes_the_same_way(
    tiny_model, done_after, turns, context, termination
):
    chat = _chat(tiny_model)
    settings = RolloutSettings(max_turns=3, seed=7, max_new_tokens=4)
    if context:
        settings = RolloutSettings(
            max_turns=3, seed=7, max_new_tokens=4, max_context_tokens=_token_budget(chat, settings)
        )
    token_policy = TokenPolicy(chat)
    tokens = _play(RolloutEngine(lambda: CountingEnv(done_after), token_policy, chat), settings)
    text_policy = TextPolicy(max_messages=3 if context else 1000)
    texts = _play(TextRolloutEngine(lambda: CountingEnv(done_after), text_policy), settings)

    for token, text in zip(tokens, texts, strict=True):
        assert token.termination == text.termination == termination
        assert token.num_turns == text.num_turns == turns
        assert [t.action for t in token.turns] == [t.action for t in text.turns]
        assert [t.observation for t in token.turns] == [t.observation for t in text.turns]
        assert [t.allowed for t in token.turns] == [t.allowed for t in text.turns]
        assert token.reward == text.reward and token.success == text.success
        assert all(
            t.logprob == pytest.approx(-0.5 * len(chat.action_ids(ACTION))) for t in token.turns
        )
        assert all(t.logprob is None for t in text.turns)
        assert text.token_ids == [] and token.num_sampled_tokens > 0
    assert sorted(token_policy.seeds) == sorted(text_policy.seeds)  # the same per-turn seeds
    assert text_policy.aclosed == 1


@pytest.mark.parametrize("kind", ["token", "text"])
def test_a_failing_policy_stops_the_run_whatever_its_kind(tiny_model, kind):
    chat = _chat(tiny_model)
    if kind == "token":
        engine = RolloutEngine(CountingEnv, TokenPolicy(chat, fail=True), chat)
    else:
        engine = TextRolloutEngine(CountingEnv, TextPolicy(fail=True))
    with pytest.raises(PolicyError, match="generation failed: RuntimeError"):
        _play(engine, RolloutSettings(max_turns=2))


def test_a_token_policy_needs_a_chat_format():
    with pytest.raises(ValueError, match="ChatFormat"):
        RolloutEngine(CountingEnv, TextPolicy(), None)  # type: ignore[arg-type]


def test_action_budget_holds_when_its_cache_fills_midway(tiny_model, monkeypatch):
    """Open action lists (spans of text) overflow the length cache; a list longer than what
    is left of the cache must still be measured whole."""
    from agentgym_core.rollout import chat
    from agentgym_core.rollout.conversation import TokenDialogue

    model, tokenizer = tiny_model
    dialogue = TokenDialogue(None, ChatFormat(tokenizer, model.generation_config))
    monkeypatch.setattr(chat, "ACTION_CACHE_SIZE", 3)
    actions = ["go red", "go blue", "go green", "go to the far yellow door", "stop"]
    longest = max(len(dialogue.chat.action_ids(a)) for a in actions)
    assert dialogue.action_budget(1, actions) == longest
    assert dialogue.action_budget(1, actions[::-1]) == longest
