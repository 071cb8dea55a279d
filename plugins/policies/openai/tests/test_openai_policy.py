"""The `openai` policy against a real OpenAI-compatible server on 127.0.0.1 (see conftest)."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from agentgym_policy_openai import EndpointError, OpenAIPolicy, OpenAIPolicyConfig

from agentgym_core.cli import main
from agentgym_core.config.errors import ConfigError
from agentgym_core.interfaces import SamplingParams
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.text import ContextWindowExceeded, TextPolicy, opening_messages

GREEDY = SamplingParams(max_new_tokens=6, greedy=True, seed=3)
ACTIONS = ["turn left", "turn right", "move forward", "go to red ball 1"]


def make_policy(server, **options) -> OpenAIPolicy:
    options = {"base_url": server.base_url, "model": "tiny", "backoff_s": 0.01, **options}
    return OpenAIPolicy(OpenAIPolicyConfig(**options))


def ask(policy, messages, params=GREEDY, allowed=None):
    async def go():
        try:
            return await policy.chat(messages, params, allowed)
        finally:
            await policy.aclose()

    return asyncio.run(go())


MESSAGES = opening_messages("Reach the goal. Answer with one action.", "You see: a red ball.")


def test_is_text_level_and_refuses_token_generation(chat_server):
    policy = make_policy(chat_server)
    assert isinstance(policy, TextPolicy) and OpenAIPolicy.text_level
    with pytest.raises(TypeError, match="text-level"):
        asyncio.run(policy.generate([1, 2], GREEDY))


def test_greedy_answer_is_the_served_models_own(chat_server):
    """Same model, same conversation: the API answer equals the local hf policy's greedy text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = make_policy(chat_server, allowed_actions="structured_outputs")
    answer = ask(policy, MESSAGES, allowed=ACTIONS)
    body = chat_server.state.bodies[-1]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 6 and body["seed"] == 3
    assert body["structured_outputs"] == {"choice": ACTIONS}
    assert body["messages"] == MESSAGES

    model = AutoModelForCausalLM.from_pretrained(chat_server.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(chat_server.model_dir)
    chat = ChatFormat(tokenizer, model.generation_config)
    local = HFPolicy(HFPolicyConfig(prefix_cache=False), model=model, tokenizer=tokenizer)
    prompt = chat.prompt_ids(MESSAGES[0]["content"], MESSAGES[2]["content"])
    expected = asyncio.run(local.generate(prompt, GREEDY, ACTIONS))
    local.close()
    assert answer == expected.text and answer in ACTIONS


def test_options_shape_the_request(chat_server):
    policy = make_policy(
        chat_server,
        system_prompt="You are an agent.",
        max_tokens=4,
        temperature=0.7,
        send_seed=False,
        extra_body={"top_p": 0.9},
    )
    ask(policy, MESSAGES, SamplingParams(max_new_tokens=6, temperature=1.3, seed=5), ACTIONS)
    body = chat_server.state.bodies[-1]
    assert body["messages"][0] == {"role": "system", "content": "You are an agent."}
    assert body["messages"][1:] == MESSAGES
    assert body["max_tokens"] == 4 and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert "seed" not in body and "structured_outputs" not in body  # default: actions in prompt


def test_retries_429_and_5xx_with_backoff_then_succeeds(chat_server):
    chat_server.state.faults = [(429, {"Retry-After": "0"}), (503, {}), (500, {})]
    policy = make_policy(chat_server, max_retries=3)
    answer = ask(policy, MESSAGES, allowed=ACTIONS)
    assert isinstance(answer, str)
    assert policy.retries == 3 and policy.requests == 4 and chat_server.state.requests == 4


def test_gives_up_after_max_retries_naming_the_last_failure(chat_server):
    chat_server.state.faults = [(503, {})] * 3
    policy = make_policy(chat_server, max_retries=2)
    with pytest.raises(EndpointError, match=r"failed 3 times; last: HTTP 503: injected fault 503"):
        ask(policy, MESSAGES)
    assert chat_server.state.requests == 3


def test_other_client_errors_fail_at_once(chat_server):
    chat_server.state.faults = [(404, {})]
    policy = make_policy(chat_server, max_retries=5)
    with pytest.raises(EndpointError, match="HTTP 404: injected fault 404"):
        ask(policy, MESSAGES)
    assert chat_server.state.requests == 1 and policy.retries == 0


def test_backoff_doubles_with_jitter_up_to_the_cap(chat_server):
    policy = make_policy(chat_server, backoff_s=1.0, backoff_max_s=5.0)
    delays = [policy._backoff(attempt) for attempt in range(5)]
    for delay, ceiling in zip(delays, [1.0, 2.0, 4.0, 5.0, 5.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling


def test_concurrency_limit_holds_and_is_reached(chat_server):
    chat_server.state.latency_s = 1.0  # long enough for 3 requests to overlap on a busy machine
    policy = make_policy(chat_server, max_concurrency=3)

    async def many():
        try:
            return await asyncio.gather(*(policy.chat(MESSAGES, GREEDY, ACTIONS) for _ in range(9)))
        finally:
            await policy.aclose()

    answers = asyncio.run(many())
    assert len(answers) == 9 and chat_server.state.requests == 9
    assert chat_server.state.max_in_flight == 3


def test_api_key_comes_from_the_named_env_var(chat_server, monkeypatch):
    chat_server.state.api_key = "sekret-123"
    monkeypatch.setenv("AGENTGYM_TEST_KEY", "sekret-123")
    ask(make_policy(chat_server, api_key_env="AGENTGYM_TEST_KEY"), MESSAGES)
    assert chat_server.state.authorizations[-1] == "Bearer sekret-123"

    monkeypatch.setenv("AGENTGYM_TEST_KEY", "wrong")
    with pytest.raises(EndpointError, match="HTTP 401.*AGENTGYM_TEST_KEY"):
        ask(make_policy(chat_server, api_key_env="AGENTGYM_TEST_KEY"), MESSAGES)

    monkeypatch.delenv("AGENTGYM_TEST_KEY")
    with pytest.raises(ConfigError, match="policy.api_key_env: environment variable AGENTGYM"):
        make_policy(chat_server, api_key_env="AGENTGYM_TEST_KEY")


def test_context_length_refusal_is_its_own_error(chat_server):
    chat_server.state.max_context = 20
    with pytest.raises(ContextWindowExceeded, match="maximum context length is 20"):
        ask(make_policy(chat_server), MESSAGES)


def test_text_engine_plays_episodes_and_ends_them_at_the_context_window(chat_server):
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.rollout.engine import EpisodeSpec, RolloutSettings
    from agentgym_core.rollout.text import TextRolloutEngine
    from agentgym_core.types import Termination

    config = BabyAIConfig(levels=["GoToObj"])
    policy = make_policy(chat_server, allowed_actions="structured_outputs")
    engine = TextRolloutEngine(lambda: BabyAIEnv(config), policy)
    specs = [EpisodeSpec(task, group=task) for task in BabyAIEnv(config).tasks("test")[:3]]
    settings = RolloutSettings(max_turns=2, greedy=True)
    played = engine.run(specs, settings)
    assert all(t.turns and t.termination in ("done", "horizon") for t in played)
    offered = {a for body in chat_server.state.bodies for a in body["structured_outputs"]["choice"]}
    assert all(turn.action in offered for t in played for turn in t.turns)
    assert all(t.token_ids == [] for t in played)  # text level: no tokens to train on

    first_turn = max(chat_server.state.prompt_tokens[: len(specs)])
    chat_server.state.max_context = first_turn + 16 + 4  # the first turn fits, later ones not
    played = engine.run(specs, RolloutSettings(max_turns=6, greedy=True, max_new_tokens=16))
    engine.close()
    assert all(t.turns for t in played)
    assert {t.termination for t in played if not t.success} <= {Termination.CONTEXT_BUDGET}
    assert any(t.termination == Termination.CONTEXT_BUDGET for t in played)


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIPolicyConfig(base_url="127.0.0.1:8000/v1", model="m")


def eval_config(tmp_path, server, **eval_options):
    """An evaluation-only pipeline: the served model over HTTP, then the checkpoint itself."""
    raw = {
        "run": {"name": "compare", "output_dir": str(tmp_path / "run")},
        "model": {"path": str(server.model_dir)},
        "env": {"name": "babyai", "levels": ["GoToObj", "GoToLocal"]},
        "rollout": {"max_context_tokens": 4096, "concurrency": 8},
        "eval": {"num_tasks": 6, "k": 1, "max_turns": 3, "greedy": True, **eval_options},
        "stages": [
            {
                "name": "api",
                "type": "eval",
                "policy": {
                    "name": "openai",
                    "base_url": server.base_url,
                    "model": "tiny-served",
                    "allowed_actions": "structured_outputs",
                },
            },
            {"name": "checkpoint", "type": "eval", "policy": {"name": "hf"}},
        ],
    }
    path = tmp_path / "compare.yaml"
    path.write_text("# agentgym eval compare.yaml\n" + yaml.safe_dump(raw))
    return path


def test_agentgym_eval_puts_api_and_checkpoint_in_one_table(tmp_path, chat_server, capsys):
    config = eval_config(tmp_path, chat_server)
    out = tmp_path / "metrics.json"
    assert main(["eval", str(config), "--json", str(out)]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    header = table[-4].split()
    assert header[:2] == ["stage", "policy"] and "GoToObj" in header and "avg@k" in header
    assert table[-2].split()[:2] == ["api", "openai"]
    assert table[-1].split()[:2] == ["checkpoint", "hf"]
    metrics = json.loads(out.read_text())
    assert metrics["api"]["episodes"] == metrics["checkpoint"]["episodes"] == 6
    # the served checkpoint, greedy, with the same action constraint, plays exactly as the local one
    assert chat_server.state.requests > 6
    for key in ("success_rate", "mean_reward", "group/GoToObj/success_rate"):
        assert metrics["api"][key] == pytest.approx(metrics["checkpoint"][key])


def test_training_with_a_text_policy_is_a_config_error(tmp_path, chat_server, capsys):
    config = eval_config(tmp_path, chat_server)
    raw = yaml.safe_load(config.read_text())
    raw.pop("stages")
    raw["policy"] = {"name": "openai", "base_url": chat_server.base_url, "model": "m"}
    raw["algorithm"] = {"name": "grpo"}
    raw["scheduler"] = {"name": "fixed", "max_turns": 2}
    config.write_text("# agentgym train compare.yaml\n" + yaml.safe_dump(raw))
    assert main(["train", str(config), "trainer.steps=1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "policy.name" in err and "text-level" in err and chat_server.state.requests == 0
