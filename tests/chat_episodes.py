"""BabyAI played through the real `hf` policy, and what its trajectory must be, token for token.

Shared by `test_chat_templates.py` (each family's template on a tokenizer trained
offline) and `test_chat_templates_real.py` (real tokenizers).
"""

from __future__ import annotations

from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import PRIMING_REPLY, ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

OBSERVATIONS = [
    "  leading and trailing spaces \n",
    'Your goal: open the door\nYou see: a wall.\nAvailable actions: ["turn left", "drop"]',
    "\n\nblank lines first",
]
"""Observations edged with whitespace, which some templates trim (Llama 3.x, Gemma)."""


class Recording:
    """The real `hf` policy, keeping every prompt it is given and every turn it samples."""

    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.calls = []

    async def generate(self, prompt_ids, params, allowed_actions=None, *, session=None):
        generation = await self.policy.generate(
            prompt_ids, params, allowed_actions, session=session
        )
        self.calls.append((list(prompt_ids), generation))
        return generation

    def release(self, session) -> None:
        self.policy.release(session)

    def sync_weights(self, model) -> None:
        self.policy.sync_weights(model)

    def close(self) -> None:
        self.policy.close()


def rendered_ids(chat: ChatFormat, messages, *, generation_prompt: bool) -> list[int]:
    """The template's own rendering of a whole conversation, tokenized in one go."""
    ids = chat.tokenizer.apply_chat_template(
        messages,
        chat_template=chat.template,
        tokenize=True,
        add_generation_prompt=generation_prompt,
        return_dict=False,
        **chat.template_kwargs,
    )
    return list(ids)


def play(make, model, tokenizer, task, *, constrained):
    """One BabyAI episode of up to 3 turns; its `ChatFormat`, trajectory and policy calls."""
    recording = Recording(HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer))
    chat = ChatFormat(tokenizer, model.generation_config)
    engine = RolloutEngine(make, recording, chat, env_threads=1)
    settings = RolloutSettings(max_turns=3, max_new_tokens=12, constrained=constrained, seed=task)
    try:
        (traj,) = engine.run([EpisodeSpec(task, task)], settings)
    finally:
        engine.close()
        recording.close()
    return chat, traj, recording.calls


def check_trajectory(chat, traj, calls, instruction, first, *, constrained) -> None:
    """The learner trains on exactly what the model was given and sampled.

    Every prompt is the previous one, the ids sampled (a turn cut at `max_new_tokens`
    closed by the end-of-turn token the model did not sample), then the observation's
    delta; the loss mask covers the sampled ids alone. In a constrained episode every
    prompt is also the template's rendering of the conversation so far in one go.
    """
    assert traj.error is None, traj.error
    assert len(calls) == len(traj.turns) >= 2, "a multi-turn episode"
    prompts = [prompt for prompt, _ in calls]
    sampled = [generation.token_ids for _, generation in calls]
    closed = [[] if generation.finished else chat.stop_ids[:1] for _, generation in calls]

    assert prompts[0] == chat.prompt_ids(instruction, first)
    assert traj.prompt_length == len(prompts[0])
    for k in range(len(calls) - 1):
        delta = chat.observation_ids(traj.turns[k].observation)
        assert prompts[k + 1] == prompts[k] + sampled[k] + closed[k] + delta  # extends the last
    assert traj.token_ids == prompts[-1] + sampled[-1] + closed[-1]
    trained = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert trained == [t for ids in sampled for t in ids]
    kept = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
    assert kept == [lp for _, generation in calls for lp in generation.logprobs]
    if not constrained:
        return

    # A prefix-stable template renders the same conversation as the same ids.
    messages = [
        {"role": "user", "content": instruction},
        {"role": "assistant", "content": PRIMING_REPLY},
        {"role": "user", "content": first},
    ]
    for k, turn in enumerate(traj.turns):
        assert turn.action in turn.allowed
        assert sampled[k] == chat.action_ids(turn.action)
        assert sampled[k][-1] == chat.stop_ids[0]
        assert prompts[k] == rendered_ids(chat, messages, generation_prompt=True)
        messages += [
            {"role": "assistant", "content": turn.action},
            {"role": "user", "content": turn.observation},
        ]
    whole = rendered_ids(chat, messages[:-1], generation_prompt=False)
    assert whole[: len(traj.token_ids)] == traj.token_ids
    assert not chat.tokenizer.decode(whole[len(traj.token_ids) :]).strip()


def check_deltas(chat: ChatFormat, observations) -> None:
    """Turn after turn, the opening prompt, actions and deltas are the template's rendering."""
    ids = chat.prompt_ids("Play.", observations[0])
    messages = [
        {"role": "user", "content": "Play."},
        {"role": "assistant", "content": PRIMING_REPLY},
        {"role": "user", "content": observations[0]},
    ]
    for observation in observations[1:]:
        ids += chat.action_ids("turn left") + chat.observation_ids(observation)
        messages += [
            {"role": "assistant", "content": "turn left"},
            {"role": "user", "content": observation},
        ]
        assert ids == rendered_ids(chat, messages, generation_prompt=True)
