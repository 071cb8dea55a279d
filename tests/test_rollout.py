"""The rollout engine with a real tiny model: tokens in and out, masks, terminations, no barrier."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from colour_env import ColourEnv

from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.packing import pack
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import PRIMING_REPLY, ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings
from agentgym_core.run.rollout_step import policy_counters
from agentgym_core.types import StepResult, Termination, TrajectoryBatch


def _engine(tiny_model, env_factory=ColourEnv, **policy_options):
    model, tokenizer = tiny_model
    policy = HFPolicy(HFPolicyConfig(**policy_options), model=model, tokenizer=tokenizer)
    return RolloutEngine(env_factory, policy, ChatFormat(tokenizer, model.generation_config))


def _episodes(n=6, samples=2):
    return [EpisodeSpec(task, group=task, sample=s) for task in range(n) for s in range(samples)]


def test_tokens_are_the_chat_template_of_the_conversation(tiny_model):
    _, tokenizer = tiny_model
    engine = _engine(tiny_model)
    env = ColourEnv(never_done=True)
    trajs = engine.run(_episodes(3, 1), RolloutSettings(max_turns=3, seed=1))
    for traj in trajs:
        messages = [
            {"role": "user", "content": env.instruction()},
            {"role": "assistant", "content": PRIMING_REPLY},
            {"role": "user", "content": env.reset(traj.task_id)},
        ]
        for turn in traj.turns:
            messages.append({"role": "assistant", "content": turn.action})
            messages.append({"role": "user", "content": turn.observation})
        rendered = tokenizer.apply_chat_template(messages[:-1], tokenize=False)
        decoded = tokenizer.decode(traj.token_ids)
        assert rendered.startswith(decoded)
        assert (
            len(rendered) - len(decoded) <= 2
        )  # at most the template's newline after the last turn


def test_loss_mask_covers_exactly_the_sampled_actions(tiny_model):
    _, tokenizer = tiny_model
    engine = _engine(tiny_model)
    (traj,) = engine.run([EpisodeSpec(4, 0)], RolloutSettings(max_turns=3, seed=2))
    sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    expected = []
    for turn in traj.turns:
        expected += tokenizer.encode(turn.action, add_special_tokens=False) + [
            engine.chat.stop_ids[0]
        ]
    assert sampled == expected
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)
    assert all(lp <= 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m)
    assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length


def test_a_free_text_turn_cut_at_max_new_tokens_is_closed_before_the_observation(tiny_model):
    """A cut turn gets the end-of-turn token (mask 0, not sampled), so the observation's
    delta follows an end of turn as the template renders it, not the agent's own text."""
    model, tokenizer = tiny_model
    engine = _engine(tiny_model)
    end = engine.chat.stop_ids[0]
    settings = RolloutSettings(max_turns=4, max_new_tokens=3, constrained=False, seed=5)
    trajs = engine.run(_episodes(4, 1), settings)
    cut = 0
    for traj in trajs:
        mask, ids = traj.loss_mask, traj.token_ids
        runs = [
            i for i in range(1, len(ids)) if mask[i - 1] == 1 and (i == len(ids) or mask[i] == 0)
        ]
        for after in runs:  # the first position after each sampled turn
            if ids[after - 1] == end:
                continue  # the model ended its turn itself
            cut += 1
            assert ids[after] == end and mask[after] == 0 and traj.logprobs[after] == 0.0
        assert ids[-1] == end or mask[-1] == 0
    assert cut > 0  # three tokens are too few for this model to end a turn every time


def test_constrained_actions_are_valid_and_logprobs_match_the_learner(tiny_model):
    model, _ = tiny_model
    engine = _engine(tiny_model)
    trajs = engine.run(_episodes(), RolloutSettings(max_turns=2, seed=3))
    env = ColourEnv()
    for traj in trajs:
        env.reset(traj.task_id)
        assert all(turn.action in env.valid_actions() for turn in traj.turns)
        assert traj.constraints and all(traj.loss_mask[p] == 1 for p in traj.constraints)
    (mb,) = pack(trajs, row_tokens=4096, micro_batch_tokens=1 << 20)
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, mb, temperature=1.0)
    mask = mb.mask.bool()
    assert torch.allclose(logprobs[mask], mb.sampler_logprobs[mask], atol=1e-4)


def test_same_seed_same_trajectories_whatever_the_batching(tiny_model):
    first = _engine(tiny_model).run(_episodes(), RolloutSettings(max_turns=3, seed=5))
    serial = _engine(tiny_model, max_batch_size=1).run(
        _episodes(), RolloutSettings(max_turns=3, seed=5, concurrency=1)
    )
    assert [t.token_ids for t in first] == [t.token_ids for t in serial]
    other = _engine(tiny_model).run(_episodes(), RolloutSettings(max_turns=3, seed=6))
    assert [t.token_ids for t in first] != [t.token_ids for t in other]


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_groups_shared_prompt_is_prefilled_once_with_the_same_samples(tiny_model, batching):
    settings = RolloutSettings(max_turns=1, seed=3)
    # the 12 requests in one batch even on a busy machine: wait for them, stop at 12
    engine = _engine(tiny_model, batching=batching, max_batch_size=12, gather_ms=5000)
    shared = engine.run(_episodes(3, 4), settings)
    firsts = [t.prompt_length for t in shared[::4]]  # the first sample of each task
    if batching == "static":  # continuous: the next test, whose arrivals do not depend on timing
        assert engine.policy.batch_sizes == [12]
        assert engine.policy.cache.computed_tokens == sum(firsts)  # 3 prompts, not 12
    serial = _engine(tiny_model, max_batch_size=1)
    alone = serial.run(_episodes(3, 4), RolloutSettings(max_turns=1, seed=3, concurrency=1))
    assert serial.policy.cache.computed_tokens == 4 * sum(firsts)
    assert [t.token_ids for t in shared] == [t.token_ids for t in alone]
    for a, b in zip(shared, alone, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({tuple(t.token_ids) for t in shared}) > 3  # the samples of a group differ
    engine.close()


def _admitted(tiny_model, prompts, seeds, max_new_tokens):
    """A continuous decoder of its own that has admitted `prompts` (seeded requests)."""
    from agentgym_core.interfaces import SamplingParams
    from agentgym_core.policies.continuous import ContinuousDecoder
    from agentgym_core.policies.prefix_cache import PrefixCache
    from agentgym_core.policies.sampling import Request, Sampler

    model, tokenizer = tiny_model
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sampler = Sampler(ChatFormat(tokenizer, model.generation_config), pad, 0)
    decoder = ContinuousDecoder(
        model, sampler, PrefixCache(), max_batch_size=8, prefix_cache=True, batch_sizes=[]
    )
    params = [SamplingParams(max_new_tokens=max_new_tokens, seed=seed) for seed in seeds]
    with torch.no_grad():  # as on the decoder's thread
        decoder._admit([Request(p, q, None, None) for p, q in zip(prompts, params, strict=True)])
    return decoder


def test_continuous_admission_prefills_a_shared_prompt_once(tiny_model):
    """Requests arriving together with one prompt: one prefill row, each request's own draw."""
    prompts = [[5, 9, 14, 21, 8], [5, 9, 14, 21, 8], [7, 3, 12], [5, 9, 14, 21, 8]]

    def admit(indices):
        chosen = [prompts[i] for i in indices]
        return _admitted(tiny_model, chosen, [100 + i for i in indices], max_new_tokens=4)

    together = admit(range(4))
    assert together.cache.computed_tokens == 5 + 3  # two distinct prompts, not four rows
    for i in range(4):
        alone = admit([i])
        row = together.batch.attention[i].bool()
        assert torch.equal(together.batch.pending[i : i + 1], alone.batch.pending)
        pairs = zip(together.batch.used_layers(), alone.batch.used_layers(), strict=True)
        for (keys, _), (lone, _) in pairs:
            alone_keys = lone[0][:, alone.batch.attention[0].bool()]
            assert torch.allclose(keys[i][:, row], alone_keys, atol=1e-5)  # padding moves rounding


def test_a_full_continuous_batch_doubles_its_buffers_and_samples_as_one_with_room(tiny_model):
    """Decode steps write into the batch's free columns; a batch with none left doubles its
    buffers first and samples what a batch with room samples; rows that leave keep the
    room and their columns."""
    from agentgym_core.policies.continuous import RunningBatch

    prompts = [[5, 9, 14, 21, 8], [7, 3, 12]]
    roomy, tight = (_admitted(tiny_model, prompts, [40, 41], max_new_tokens=8) for _ in range(2))
    b = tight.batch
    assert roomy.batch.capacity > roomy.batch.width
    squeezed = [(k[:, :, : b.width].clone(), v[:, :, : b.width].clone()) for k, v in b.layers]
    tight.batch = RunningBatch(b.requests, squeezed, b.attention, b.position, b.pending)
    width = b.width
    with torch.no_grad():
        for _ in range(3):
            roomy._decode_step()
            tight._decode_step()
            assert torch.equal(roomy.batch.pending, tight.batch.pending)
    assert tight.batch.capacity == 2 * width  # doubled once, at the first step
    for (k1, _), (k2, _) in zip(roomy.batch.used_layers(), tight.batch.used_layers(), strict=True):
        torch.testing.assert_close(k1, k2, rtol=0, atol=1e-5)  # wider masks move rounding
    before = roomy.batch
    kept = before.keep([1])
    assert kept.capacity - kept.width == before.capacity - before.width
    row = before.attention[1].bool()
    for (k, _), (one, _) in zip(before.used_layers(), kept.used_layers(), strict=True):
        assert torch.equal(one[0][:, kept.attention[0].bool()], k[1][:, row])


def test_shared_rows_pairs_requests_with_one_prompt_and_no_cache():
    from agentgym_core.policies.prefix_cache import shared_rows

    cached = object()
    rows, firsts = shared_rows([[1, 2], [3], [1, 2], [1, 2], [3]], [None, None, None, cached, None])
    assert rows == [0, 1, 0, 2, 1] and firsts == [0, 1, 3]
    assert shared_rows([], []) == ([], [])


def test_env_calls_inline_on_the_event_loop_give_the_threads_trajectories(tiny_model):
    """`env_threads: 0` runs env calls on the event loop's own thread, with the same episodes."""
    model, tokenizer = tiny_model
    callers: set[str] = set()

    class Recorded(ColourEnv):
        def step(self, action):
            callers.add(threading.current_thread().name)
            return super().step(action)

    def engine(threads, factory=Recorded):
        policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
        chat = ChatFormat(tokenizer, model.generation_config)
        return RolloutEngine(factory, policy, chat, env_threads=threads)

    threaded = engine(4).run(_episodes(), RolloutSettings(max_turns=3, seed=5))
    assert callers and all(name.startswith("env_") for name in callers)
    callers.clear()
    inline = engine(0).run(_episodes(), RolloutSettings(max_turns=3, seed=5))
    assert callers == {threading.main_thread().name}  # `run` owns its loop on this thread
    assert [t.token_ids for t in inline] == [t.token_ids for t in threaded]
    assert [t.reward for t in inline] == [t.reward for t in threaded]

    crash = engine(0, lambda: ColourEnv(fail_on={1})).run(
        _episodes(3, 1), RolloutSettings(max_turns=3, seed=0)
    )
    assert [t.termination == Termination.ENV_ERROR for t in crash] == [False, True, False]
    assert "env crashed on task 1" in crash[1].error


def test_termination_reasons(tiny_model):
    horizon = _engine(tiny_model, lambda: ColourEnv(never_done=True)).run(
        _episodes(2, 1), RolloutSettings(max_turns=2, seed=0)
    )
    assert {t.termination for t in horizon} == {Termination.HORIZON}
    assert all(t.num_turns == 2 for t in horizon)

    budget = _engine(tiny_model, lambda: ColourEnv(never_done=True)).run(
        _episodes(2, 1), RolloutSettings(max_turns=50, max_context_tokens=90, seed=0)
    )
    assert {t.termination for t in budget} == {Termination.CONTEXT_BUDGET}
    assert all(len(t.token_ids) <= 90 for t in budget)

    done = _engine(tiny_model).run(_episodes(6, 4), RolloutSettings(max_turns=20, seed=0))
    assert all(t.termination == Termination.DONE and t.success for t in done)


def test_env_errors_are_recorded_and_excluded(tiny_model):
    crash = _engine(tiny_model, lambda: ColourEnv(fail_on={1})).run(
        _episodes(3, 2), RolloutSettings(max_turns=3, seed=0)
    )
    errors = [t for t in crash if t.termination == Termination.ENV_ERROR]
    assert [t.task_id for t in errors] == [1, 1]
    assert "env crashed on task 1" in errors[0].error
    batch = TrajectoryBatch(crash)
    assert all(t.task_id != 1 for t in batch.trainable) and len(batch.trainable) == 4

    # a timeout far above a normal call's time, so that a loaded machine times out nothing else
    slow = _engine(tiny_model, lambda: ColourEnv(slow_tasks={0}, delay=6.0)).run(
        _episodes(2, 1), RolloutSettings(max_turns=2, env_timeout_s=2.0, seed=0)
    )
    assert slow[0].termination == Termination.ENV_ERROR and "longer than 2.0 s" in slow[0].error
    assert slow[1].termination != Termination.ENV_ERROR


def test_no_barrier_between_episodes(tiny_model):
    """Fast episodes finish all their turns while a slow one is still in its first env step."""
    log: list[tuple[int, float]] = []
    engine = _engine(
        tiny_model, lambda: ColourEnv(slow_tasks={0}, delay=3.0, never_done=True, log=log)
    )
    start = time.perf_counter()
    engine.run(_episodes(4, 1), RolloutSettings(max_turns=4, seed=0))
    slow_first_step = min(t for task, t in log if task == 0)
    fast_last_steps = [max(t for task, t in log if task == k) for k in (1, 2, 3)]
    assert all(t < slow_first_step for t in fast_last_steps)
    assert slow_first_step - start >= 3.0


class _StaggeredResets(ColourEnv):
    """Task k's reset takes 150 k ms: requests reach the policy well apart, even when busy."""

    def reset(self, task_id):
        time.sleep(0.15 * task_id)
        return super().reset(task_id)


@pytest.mark.parametrize(("gather_ms", "one_batch"), [(1000.0, True), (0.0, False)])
def test_requests_arriving_close_together_share_a_batch(tiny_model, gather_ms, one_batch):
    engine = _engine(tiny_model, _StaggeredResets, gather_ms=gather_ms)
    engine.run(_episodes(6, 1), RolloutSettings(max_turns=1, seed=0))
    assert sum(engine.policy.batch_sizes) == 6
    assert (engine.policy.batch_sizes == [6]) is one_batch


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_observation_delta_is_the_templates_user_turn(tiny_model, template):
    _, tokenizer = tiny_model
    chat = ChatFormat(tokenizer)
    ids = chat.observation_ids("hello there")
    text = tokenizer.decode(ids)
    assert "hello there" in text
    # the delta opens a user turn and ends with the assistant generation prompt
    probe = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "hello there"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert probe.endswith(text)


def test_prefix_cache_reuses_turns_without_changing_samples(tiny_model):
    settings = RolloutSettings(max_turns=4, seed=9)
    cached = _engine(tiny_model, lambda: ColourEnv(never_done=True))
    plain = _engine(tiny_model, lambda: ColourEnv(never_done=True), prefix_cache=False)
    with_cache = cached.run(_episodes(5, 2), settings)
    without = plain.run(_episodes(5, 2), settings)
    assert [t.token_ids for t in with_cache] == [t.token_ids for t in without]
    for a, b in zip(with_cache, without, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    stats = cached.policy.cache
    assert stats.reused_tokens > stats.computed_tokens  # later turns mostly come from the cache
    assert len(stats) == 0  # every finished episode released its state
    assert plain.policy.cache.reused_tokens == 0


def test_hf_counters_split_generation_time_into_parts(tiny_model):
    """`policy/<part>_seconds` metrics: the parts add up to the generation thread's busy time."""
    engine = _engine(tiny_model, lambda: ColourEnv(never_done=True))
    busy = []
    generate_batch = engine.policy._generate_batch

    def timed(batch):
        start = time.perf_counter()
        generate_batch(batch)
        busy.append(time.perf_counter() - start)

    engine.policy._generate_batch = timed
    engine.run(_episodes(4, 2), RolloutSettings(max_turns=3, seed=1))
    counters = engine.policy.counters()
    parts = [counters[f"{part}_seconds"] for part in ("kv_cache", "prefill", "sampling", "decode")]
    assert min(parts) > 0
    # the parts leave out only untimed bookkeeping, which a busy machine may stretch
    assert 0.5 * sum(busy) < sum(parts) <= sum(busy)
    assert sorted(policy_counters(engine.policy)) == sorted(f"policy/{k}" for k in counters)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_generation_runs_with_its_own_thread_count_and_leaves_the_callers(tiny_model, batching):
    """`policy.num_threads`: the generation thread's torch count; the caller's and new threads'
    stay as they were (the learner keeps every core)."""
    original = torch.get_num_threads()
    torch.set_num_threads(2)
    model = tiny_model[0]
    forward = model.forward
    seen = []

    def counted(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return forward(*args, **kwargs)

    try:
        engine = _engine(tiny_model, num_threads=1, batching=batching)
        model.forward = counted
        played = engine.run(_episodes(2, 2), RolloutSettings(max_turns=2, seed=1))
        del model.forward
        assert seen and set(seen) == {1}
        assert all(t.turns for t in played)
        assert torch.get_num_threads() == 2
        fresh = []
        thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert fresh == [2]
    finally:
        model.__dict__.pop("forward", None)
        torch.set_num_threads(original)


def test_env_timeout_counts_running_time_not_queueing(tiny_model):
    """Six 0.5 s steps through one env thread: each fits a 2 s timeout although they queue 3 s."""
    model, tokenizer = tiny_model
    policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
    engine = RolloutEngine(
        lambda: ColourEnv(slow_tasks=range(6), delay=0.5),
        policy,
        ChatFormat(tokenizer, model.generation_config),
        env_threads=1,
    )
    out = engine.run(_episodes(6, 1), RolloutSettings(max_turns=1, env_timeout_s=2.0, seed=0))
    assert Termination.ENV_ERROR not in {t.termination for t in out}
    assert engine.env_seconds >= 6 * 0.5


class _HangingEnv(ColourEnv):
    """Task 0's step blocks until `release` is set; records closes."""

    def __init__(self, release, closed):
        super().__init__(never_done=True)
        self.release, self.closed = release, closed

    def step(self, action):
        if self.task == 0:
            self.release.wait()
        return super().step(action)

    def close(self):
        self.closed.append(self.task)


def test_hung_env_frees_its_slot_and_is_closed_once_it_returns(tiny_model):
    import threading

    release, closed = threading.Event(), []
    model, tokenizer = tiny_model
    policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
    engine = RolloutEngine(
        lambda: _HangingEnv(release, closed),
        policy,
        ChatFormat(tokenizer, model.generation_config),
        env_threads=1,
    )
    out = engine.run(_episodes(3, 1), RolloutSettings(max_turns=2, env_timeout_s=2.0, seed=0))
    assert out[0].termination == Termination.ENV_ERROR and "longer than 2.0 s" in out[0].error
    assert [t.termination for t in out[1:]] == [Termination.HORIZON] * 2
    assert closed == []  # never closed under a call that is still running
    release.set()
    deadline = time.perf_counter() + 5
    while not closed and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert closed == [0]
    engine.close()


def test_policy_failure_stops_the_rollout_instead_of_blaming_the_env(tiny_model):
    from agentgym_core.rollout.engine import PolicyError

    engine = _engine(tiny_model)

    async def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    engine.policy.generate = broken
    with pytest.raises(PolicyError, match="CUDA out of memory"):
        engine.run(_episodes(2, 1), RolloutSettings(max_turns=2, seed=0))


def test_one_failing_generation_stops_the_rollout_while_others_wait_on_the_policy(tiny_model):
    """The failure comes out as the run's error while other episodes wait on the real policy.

    (The hang this once caused, a cancelled episode playing on, is reproduced exactly by
    `test_a_cancelled_call_stays_cancelled_though_it_returned_a_moment_before`.)"""
    import concurrent.futures

    from agentgym_core.rollout.engine import PolicyError

    engine = _engine(tiny_model)
    real, calls = engine.policy.generate, []

    async def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # the others are queued on the real policy by now
            raise RuntimeError("one bad request")
        return await real(*args, **kwargs)

    engine.policy.generate = fails_once
    settings = RolloutSettings(max_turns=3, seed=0, concurrency=8)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(engine.run, _episodes(8, 2), settings)
        with pytest.raises(PolicyError, match="one bad request"):
            running.result(timeout=60)
    engine.close()


class _TupleStepEnv(ColourEnv):
    def step(self, action):
        result = super().step(action)
        return result.observation, result.reward, result.done  # gym style: not a StepResult


class _DictResetEnv(ColourEnv):
    def reset(self, task_id):
        return {"observation": super().reset(task_id)}


class _NumberRewardEnv(ColourEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, str(result.reward), result.done)


@pytest.mark.parametrize(
    ("env", "method", "detail"),
    [
        (_TupleStepEnv, "step()", "must return agentgym_core.types.StepResult, got tuple"),
        (_DictResetEnv, "reset()", "must return a str, got dict: {'observation'"),
        (_NumberRewardEnv, "step()", "reward is str, not a number"),
    ],
)
def test_wrong_types_from_an_env_stop_the_run_naming_env_method_and_value(
    tiny_model, env, method, detail
):
    from agentgym_core.rollout.contract import EnvironmentContractError

    engine = _engine(tiny_model, env_factory=env)
    with pytest.raises(EnvironmentContractError) as caught:
        engine.run(_episodes(2, 1), RolloutSettings(max_turns=2, seed=0))
    message = str(caught.value)
    assert message.startswith(f"environment {env.__name__} ({env.__module__}): {method}")
    assert detail in message
    engine.close()


class _LongActionEnv(ColourEnv):
    def valid_actions(self):
        return [f"go to {c} ball " + "and then wait " * 6 for c in self.options]


def test_constrained_actions_longer_than_max_new_tokens_respect_the_context_budget(tiny_model):
    model, tokenizer = tiny_model
    chat = ChatFormat(tokenizer, model.generation_config)
    probe = _LongActionEnv()
    probe.reset(0)
    longest = max(len(chat.action_ids(a)) for a in probe.valid_actions())
    engine = _engine(tiny_model, lambda: _LongActionEnv(never_done=True))
    out = engine.run(
        _episodes(3, 1),
        RolloutSettings(max_turns=50, max_new_tokens=4, max_context_tokens=110, seed=0),
    )
    assert longest > 4 and all(t.prompt_length + 4 <= 110 for t in out)
    assert all(len(t.token_ids) <= 110 for t in out)
    assert {t.termination for t in out} == {Termination.CONTEXT_BUDGET}


def test_env_pool_close_closes_every_instance_even_when_one_fails():
    from agentgym_core.rollout.engine import EnvPool

    closed = []

    class Env(ColourEnv):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def close(self):
            closed.append(self.name)
            if self.name == "b":
                raise RuntimeError("b failed to close")

    names = iter("abc")
    pool = EnvPool(lambda: Env(next(names)))
    envs = [pool.acquire() for _ in range(3)]
    for env in envs:
        pool.release(env)
    with pytest.raises(RuntimeError, match="b failed"):
        pool.close()
    assert sorted(closed) == ["a", "b", "c"]


def test_env_pool_close_closes_instances_stopped_mid_episode_and_not_dropped_ones():
    """A run stopped mid-episode still closes what was out; a hung close is left behind."""
    import threading
    import time

    from agentgym_core.rollout.engine import EnvPool

    closed = []
    hang = threading.Event()

    class Env(ColourEnv):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def close(self):
            if self.name == "hung":
                hang.wait()
            closed.append(self.name)

    names = iter(["idle", "out", "dropped", "hung"])
    pool = EnvPool(lambda: Env(next(names)))
    idle, out, dropped, hung = (pool.acquire() for _ in range(4))
    pool.release(idle)
    pool.drop(dropped)  # its owner closes it (`RolloutEngine._discard`)
    start = time.monotonic()
    pool.close(out_timeout_s=3.0)  # room for the closing threads to start on a busy machine
    assert time.monotonic() - start < 10
    assert sorted(closed) == ["idle", "out"]
    hang.set()


def test_forced_action_tail_is_appended_without_forward_passes(tiny_model):
    """Once one allowed action remains, its remaining tokens cost no forward pass; log-prob 0."""
    import asyncio

    from agentgym_core.interfaces import SamplingParams

    model, tokenizer = tiny_model
    policy = HFPolicy(HFPolicyConfig(prefix_cache=False), model=model, tokenizer=tokenizer)
    chat = ChatFormat(tokenizer, model.generation_config)
    actions = ["go to the red ball and wait there", "turn left"]
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        prompt = chat.prompt_ids("Act.", "You see a red ball.")
        params = SamplingParams(max_new_tokens=4, greedy=True)
        generation = asyncio.run(policy.generate(prompt, params, actions))
    finally:
        hook.remove()
        policy.close()
    assert generation.text in actions
    tokens = chat.action_ids(generation.text)
    assert generation.token_ids == tokens
    assert len(calls) < len(tokens)  # the prefill plus far fewer decode steps than tokens
    forced = [p for p, ids in enumerate(generation.allowed) if ids is not None and len(ids) == 1]
    assert forced and all(generation.logprobs[p] == 0.0 for p in forced)


class _DrawingEnv(ColourEnv):
    """Draws a picture whose one red pixel marks how many steps were taken; task 3's fails."""

    def reset(self, task_id):
        self.steps = 0
        return super().reset(task_id)

    def step(self, action):
        self.steps += 1
        return super().step(action)

    def render(self):
        import numpy as np

        if self.task == 3:
            raise RuntimeError("no display")
        image = np.zeros((600, 300, 3), dtype=np.uint8)  # shrunk to every 3rd pixel: 200 x 100
        image[0, 3 * self.steps] = (255, 0, 0)
        return image


def test_frames_follow_the_logged_episodes_and_a_failing_render_costs_nothing(tiny_model):
    import base64
    import io

    from PIL import Image

    from agentgym_core.types import round_robin

    engine = _engine(tiny_model, env_factory=lambda: _DrawingEnv(never_done=True))
    episodes = [
        EpisodeSpec(task_id=t, group=i, sample=s) for i, t in enumerate(range(5)) for s in (0, 1)
    ]
    settings = RolloutSettings(max_turns=3, seed=1, frames=4)
    trajectories = engine.run(episodes, settings)
    framed = [t for t in trajectories if t.frames is not None]
    want = round_robin(episodes, 4)  # sample 0 of tasks 0-3: what the tracker logs first
    assert [(t.task_id, 0) for t in framed] == [(s.task_id, s.sample) for s in want]
    for trajectory in trajectories:
        assert trajectory.first_observation.startswith("Your goal: go to the")
        assert trajectory.termination == Termination.HORIZON  # the episode itself is untouched
    for trajectory in framed:
        assert len(trajectory.frames) == 4  # reset, then after each of 3 turns
        if trajectory.task_id == 3:
            assert trajectory.frames == ["(render() failed: RuntimeError: no display)"] * 4
            continue
        for steps, frame in enumerate(trajectory.frames):
            image = Image.open(io.BytesIO(base64.b64decode(frame.split(",", 1)[1])))
            assert image.size == (100, 200)
            assert image.convert("RGB").getpixel((steps, 0)) == (255, 0, 0)
    assert engine.run(episodes[:2], RolloutSettings(max_turns=2))[0].frames is None  # off
    engine.close()


def test_encoded_frames_are_bounded():
    import base64

    from agentgym_core.rollout.frames import MAX_BYTES, PNG_SIGNATURE, encode_frame

    assert encode_frame("inventory: [stick] (2)") == "inventory: [stick] (2)"
    assert encode_frame(None) is None
    assert encode_frame(b"GIF89a") == "(a frame that is not a PNG image)"
    png = PNG_SIGNATURE + b"rest"
    assert encode_frame(png) == "data:image/png;base64," + base64.b64encode(png).decode()
    assert (
        encode_frame("x" * (MAX_BYTES + 1))
        == f"(frame of {MAX_BYTES + 1} bytes left out: over {MAX_BYTES})"
    )


@pytest.mark.parametrize("constrained", [True, False])
def test_continuous_batching_gives_the_same_tokens_as_static(tiny_model, constrained):
    """Requests join and leave the running batch; every episode's tokens stay the same."""
    settings = RolloutSettings(max_turns=4, seed=11, constrained=constrained, max_new_tokens=10)

    def env():
        return ColourEnv(never_done=True, slow_tasks=(1, 4), delay=0.03)

    static = _engine(tiny_model, env).run(_episodes(8, 2), settings)
    engine = _engine(tiny_model, env, batching="continuous")
    continuous = engine.run(_episodes(8, 2), settings)
    assert [t.token_ids for t in continuous] == [t.token_ids for t in static]
    for a, b in zip(continuous, static, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.constraints == b.constraints
    decoder = engine.policy._decoder
    assert decoder.joined > 0  # some requests joined rows that were mid-generation
    assert engine.policy.cache.reused_tokens > engine.policy.cache.computed_tokens
    assert len(engine.policy.cache) == 0  # every finished episode released its KV state
    assert engine.policy.model.training is tiny_model[0].training  # mode restored when idle
    again = engine.run(_episodes(8, 2), settings)  # the worker serves a second run as well
    assert [t.token_ids for t in again] == [t.token_ids for t in static]
    engine.close()


def test_turns_record_the_allowed_actions_and_the_chosen_ones_logprob(tiny_model):
    """What the viewer shows per turn: the constraint and the action's sampling probability."""
    engine = _engine(tiny_model, lambda: ColourEnv(never_done=True))
    for trajectory in engine.run(_episodes(3, 2), RolloutSettings(max_turns=3, seed=4)):
        assert len(trajectory.turns) == 3
        for turn in trajectory.turns:
            assert turn.allowed and turn.action in turn.allowed and turn.logprob < 0
        assert sum(t.logprob for t in trajectory.turns) == pytest.approx(
            sum(trajectory.logprobs), abs=1e-5
        )
    free = engine.run(_episodes(1, 1), RolloutSettings(max_turns=1, constrained=False))
    assert free[0].turns[0].allowed is None and free[0].turns[0].logprob is not None
    engine.close()


def test_an_evaluation_can_lift_the_constraint_so_the_env_gets_what_the_model_writes(tiny_model):
    """`eval.constrained: false` on a constrained rollout: the untrained model's free text is
    mostly not a valid action, and the env is given it as written."""
    from agentgym_core.run.evaluate import EvalSettings, run_evaluation

    engine, env = _engine(tiny_model), ColourEnv()
    tasks = list(range(6))
    rollout = RolloutSettings(max_turns=2, constrained=True)

    def actions(constrained):
        settings = EvalSettings(k=2, max_turns=2, seed=4, constrained=constrained)
        _, trajectories = run_evaluation(engine, tasks, settings, rollout)
        played = []
        for traj in trajectories:
            env.reset(traj.task_id)
            played += [(turn.action, turn.action in env.valid_actions()) for turn in traj.turns]
        return played

    assert all(valid for _, valid in actions(None))  # the rollout's setting: constrained
    free = actions(False)
    assert sum(not valid for _, valid in free) > len(free) // 2


def test_on_done_hears_of_every_episode_as_it_ends_and_on_turn_of_every_step(tiny_model):
    engine = _engine(tiny_model)
    seen, turns = [], []
    settings = RolloutSettings(max_turns=2, seed=1)
    out = engine.run(_episodes(3, 2), settings, seen.append, lambda: turns.append(1))
    assert len(seen) == 6 and {id(t) for t in seen} == {id(t) for t in out}
    assert len(turns) == sum(len(t.turns) for t in out) > 6


def test_an_evaluation_carries_every_rollout_setting_it_does_not_set_itself():
    """A rollout option added later reaches evaluations: each field of training's settings
    is carried unless the evaluation names it as its own (EVALUATION_OVERRIDES)."""
    import dataclasses

    from agentgym_core.run.evaluate import EVALUATION_OVERRIDES, EvalSettings, evaluation_play

    fields = {field.name: field for field in dataclasses.fields(RolloutSettings)}
    assert set(fields) >= EVALUATION_OVERRIDES
    odd = {  # every field away from its default, so a dropped one shows
        name: (not field.default) if isinstance(field.default, bool) else 4_321
        for name, field in fields.items()
    }
    training = RolloutSettings(**odd)
    evaluation = EvalSettings(max_turns=7, greedy=True, temperature=0.5, seed=3, constrained=None)
    play = evaluation_play(evaluation, training)
    for name in fields:
        if name not in EVALUATION_OVERRIDES:
            assert getattr(play, name) == getattr(training, name), name
    assert (play.max_turns, play.greedy, play.temperature) == (7, True, 0.5)
    assert play.constrained == training.constrained and play.seed == 3 + 7_919


def test_prefill_groups_split_where_padding_costs_most_and_only_when_it_pays():
    from agentgym_core.policies.hf import prefill_groups

    # a new episode's 557-token prompt among three 100-token observations: 4 x 557 padded
    # against 3 x 100 + 557, a saving of 1,371 tokens
    assert prefill_groups([100, 100, 557, 90], 1024) == [[0, 1, 3], [2]]
    assert prefill_groups([100, 100, 557, 90], 1400) == [[0, 1, 2, 3]]  # saves too little
    assert prefill_groups([100, 100, 557, 90], 0) == [[0, 1, 2, 3]]  # 0: never
    assert prefill_groups([557, 557, 80, 100, 557], 1) == [[2], [3], [0, 1, 4]]
    assert prefill_groups([557, 557, 80, 100, 557], 50) == [[2, 3], [0, 1, 4]]
    assert prefill_groups([300], 1) == [[0]]


def test_a_split_prefill_samples_the_same_tokens_as_one_batch(tiny_model, monkeypatch):
    """Episodes that end early are replaced by new ones, whose first prompts join batches of
    continuing episodes: split (any saving) and never split give the same trajectories."""
    settings = RolloutSettings(max_turns=4, seed=13, concurrency=6)
    split = _engine(tiny_model, split_prefill_tokens=1)
    groups = []  # per batch: its prefill rows, and the groups' sizes
    prefill = split.policy._prefill

    def spy(pre, sizes, *args):
        groups.append((pre.input_ids.shape[0], sizes))
        return prefill(pre, sizes, *args)

    monkeypatch.setattr(split.policy, "_prefill", spy)
    together = _engine(tiny_model, split_prefill_tokens=0)
    a = split.run(_episodes(8, 2), settings)
    b = together.run(_episodes(8, 2), settings)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    assert any(len(sizes) > 1 for _, sizes in groups)  # some batches ran as two groups
    assert all(sum(sizes) == rows for rows, sizes in groups)
    assert len(groups) == len(split.policy.batch_sizes)  # and decoded as one
    split.close()
    together.close()


def test_the_prefix_cache_counts_the_padded_positions_a_prefill_runs():
    from agentgym_core.policies.prefix_cache import PrefixCache

    cache = PrefixCache()
    cache.prefill([[1, 2, 3, 4, 5], [6, 7]], [None, None], pad_id=0)
    assert (cache.computed_tokens, cache.padded_tokens) == (7, 10)  # two rows of five
    cache.prefill([[1, 2, 3, 4, 5], [6, 7]], [None, None], pad_id=0, groups=[1, 1])
    assert (cache.computed_tokens, cache.padded_tokens) == (14, 17)  # each to its own tail


@pytest.mark.parametrize("split", [0, 1])
def test_a_sessions_old_keys_are_freed_once_copied_into_the_batch(tiny_model, split):
    """Taken from the cache, a session's entry lives only until the batch's prefill is built,
    not through the decode (peak memory: one copy of the keys, not two)."""
    import asyncio
    import weakref

    from agentgym_core.interfaces import SamplingParams

    model, tokenizer = tiny_model
    policy = HFPolicy(HFPolicyConfig(split_prefill_tokens=split), model=model, tokenizer=tokenizer)
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    prompts = {"a": list(range(5, 40)), "b": list(range(7, 19))}
    alive_at_sampling = []

    async def turns():
        first = await asyncio.gather(
            *(policy.generate(p, params, session=s) for s, p in prompts.items())
        )
        old = {s: weakref.ref(policy.cache._entries[s]) for s in prompts}
        sample = policy.sampler.sample

        def spy(*args, **kwargs):
            alive_at_sampling.append(sorted(s for s, ref in old.items() if ref() is not None))
            return sample(*args, **kwargs)

        policy.sampler.sample = spy
        later = [p + g.token_ids + [3, 4, 5] for p, g in zip(prompts.values(), first, strict=True)]
        await asyncio.gather(
            *(policy.generate(p, params, session=s) for s, p in zip(prompts, later, strict=True))
        )

    asyncio.run(turns())
    policy.close()
    assert policy.cache.reused_tokens > 0  # the second turn did take the sessions' entries
    assert alive_at_sampling and all(alive == [] for alive in alive_at_sampling)


def test_prefill_groups_fill_one_batch_cache_that_decodes_once(tiny_model):
    """First prompts of different lengths (no session cached yet), then a new session's
    prompt beside two continuing ones, one with a long observation: prefilled in groups
    (any saving splits), they sample the same tokens and log-probs as one group, and
    each batch decodes once."""
    import asyncio

    from agentgym_core.interfaces import SamplingParams

    def play(split):
        model, tokenizer = tiny_model
        config = HFPolicyConfig(split_prefill_tokens=split, seed=5)
        policy = HFPolicy(config, model=model, tokenizer=tokenizer)
        params = SamplingParams(max_new_tokens=5, temperature=1.0)
        groups = []
        prefill = policy._prefill

        def spy(pre, sizes, *args):
            groups.append(len(sizes))
            return prefill(pre, sizes, *args)

        policy._prefill = spy

        async def turns():
            first = {"a": list(range(5, 40)), "b": list(range(7, 12))}
            one = await asyncio.gather(
                *(policy.generate(p, params, session=s) for s, p in first.items())
            )
            second = {
                "a": first["a"] + one[0].token_ids + [3, 4, 5],
                "b": first["b"] + one[1].token_ids + list(range(20, 45)),
                "c": list(range(9, 60)),
            }
            two = await asyncio.gather(
                *(policy.generate(p, params, session=s) for s, p in second.items())
            )
            return one + two

        generations = asyncio.run(turns())
        policy.close()
        return generations, groups, policy.batch_sizes

    split, groups, batches = play(1)
    together, one_group, _ = play(0)
    assert batches == [2, 3] and groups == [2, 3] and one_group == [1, 1]
    assert [g.token_ids for g in split] == [g.token_ids for g in together]
    for x, y in zip(split, together, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
