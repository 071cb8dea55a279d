"""TRL's GRPOTrainer trains on our BabyAI through our OpenEnv server (examples/trl_openenv.py).

A real uvicorn server on 127.0.0.1, `openenv`'s client, TRL 1.16's
trainer; the `trl` extra (make installs it). What must hold: every episode
TRL trained on was played on the server (replaying its actions in-process
gives the same rewards), TRL's reward is the env's, only sampled tokens are
trained on, the constraint kept every action valid, and the weights moved.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the `trl` extra: pip install -e '.[trl]' (make installs it)")
pytest.importorskip("openenv.core", reason="make installs openenv (docs/openenv.md)")
pytest.importorskip("agentgym_env_babyai")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from agentgym_core.plugins import PluginHost  # noqa: E402
from agentgym_core.serve import ServerThread, build_app  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "trl_openenv.py"
BABYAI = {"levels": ["GoToObj", "GoToLocal"]}


def _example():
    spec = importlib.util.spec_from_file_location("trl_openenv_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Record(TrainerCallback):
    """What each update's rollout returned and what TRL logged."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.logs.append(dict(logs))


def test_trl_grpo_trains_on_babyai_over_our_openenv_server(
    agentgym_tiny_model, tmp_path, monkeypatch
):
    example = _example()
    model = agentgym_tiny_model({"name": "babyai", **BABYAI}, expert_turns=200)
    host = PluginHost()
    registration = host.registry.get("environment", "babyai")
    local = registration.factory(registration.config.model_validate(BABYAI))
    app = build_app(host.registry, "babyai", BABYAI, protocol="openenv", max_sessions=16)
    played: list[dict] = []
    with ServerThread(app) as server:
        from transformers import AutoTokenizer

        rollout = example.openenv_rollout(
            server.url, AutoTokenizer.from_pretrained(model), max_turns=3
        )

        def recording(prompts, trainer):
            out = rollout(prompts, trainer)
            played.append({"prompts": prompts, **out})
            return out

        recording.sessions = rollout.sessions
        before = {k: v.clone() for k, v in _weights(model).items()}
        record = Record()
        monkeypatch.setattr(example, "openenv_rollout", lambda *a, **k: recording)
        example.train(
            server.url,
            model,
            tmp_path / "trained",
            updates=2,
            tasks_per_update=2,
            group_size=4,
            max_turns=3,
            callbacks=[record],
        )
    turns_seen = 0
    try:
        assert len(played) == 2 and all(len(p["completion_ids"]) == 8 for p in played)
        train = set(local.tasks("train"))
        for update, batch in zip(record.logs, played, strict=True):
            rewards = []
            for prompt, actions, reward, ids, mask in zip(
                batch["prompts"],
                batch["actions"],
                batch["episode_reward"],
                batch["completion_ids"],
                batch["env_mask"],
                strict=True,
            ):
                task = int(prompt[-1]["content"].rsplit(" ", 1)[1])
                assert task in train
                local.reset(task)
                replayed = 0.0
                for action in actions:
                    assert action in local.valid_actions()  # the constraint held
                    result = local.step(action)
                    replayed += result.reward
                    if result.done:
                        break
                assert replayed == pytest.approx(reward)
                assert len(mask) == len(ids) and mask[0] == 1
                if len(actions) > 1:  # observations between turns are in, and not trained on
                    assert 0 in mask
                    turns_seen += 1
                rewards.append(reward)
            assert update["reward"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-6)
        assert turns_seen > 0
        after = _weights(tmp_path / "trained")
        assert any(not torch.equal(before[k], after[k]) for k in before)
    finally:
        local.close()


def _weights(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(folder).state_dict())
