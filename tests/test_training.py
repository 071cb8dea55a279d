"""Real training runs on a tiny model and BabyAI: resume exactness and learning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from agentgym_core import hookimpl
from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.rollout.engine import EnvironmentDown
from agentgym_core.run.kinds import run_stage

pytest.importorskip("agentgym_env_babyai")
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv  # noqa: E402


def _config(
    tmp_path: Path, model: Path, out: str, algorithm: dict | None = None, **trainer
) -> Path:
    raw = {
        "run": {"name": "t", "output_dir": str(tmp_path / out), "seed": 3},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": ["GoToObj", "PickupDist"], "list_actions": False},
        "algorithm": algorithm or {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 768, "concurrency": 16},
        "trainer": {
            "steps": 4,
            "tasks_per_step": 4,
            "group_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 2,
            **trainer,
        },
        "tracking": {"log_trajectories": 2},
    }
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def babyai_model(tmp_path_factory) -> Path:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj", "PickupDist"], list_actions=False))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(
        texts, tmp_path_factory.mktemp("babyai-model"), TinyModelConfig(vocab_size=400)
    )


def _train(path: Path, host: PluginHost, *overrides: str):
    resolved = load_config(path, list(overrides), host.registry)
    return run_stage(resolved, host, show_progress=False)


def test_resume_continues_exactly(tmp_path, babyai_model, cpu_contention):
    host = PluginHost()
    straight = _train(_config(tmp_path, babyai_model, "straight"), host)
    interrupted = _config(tmp_path, babyai_model, "resumed")
    first = _train(interrupted, host, "trainer.steps=2")
    assert first.resumed_from == 0 and len(first.history) == 2
    resumed = _train(interrupted, host)
    assert resumed.resumed_from == 2
    keys = ["rollout/success_rate", "rollout/reward_mean", "rollout/generated_tokens", "train/loss"]
    for step in (2, 3):
        for key in keys:
            assert resumed.history[step][key] == pytest.approx(
                straight.history[step][key], abs=1e-6
            )
    a = AutoModelForCausalLM.from_pretrained(straight.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def _critic_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    return state["extra"]["learner"]["critic"]["weights"]


@pytest.mark.parametrize("critic", ["head", "model"])
def test_ppo_resume_continues_exactly_with_its_critic(tmp_path, babyai_model, critic):
    """Interrupted during the critic's warm-up, PPO resumes as if never stopped."""
    algorithm = {"name": "ppo", "critic": critic, "critic_warmup": 2}
    host = PluginHost()
    straight = _train(_config(tmp_path, babyai_model, "straight", algorithm, steps=3), host)
    interrupted = _config(tmp_path, babyai_model, "resumed", algorithm, steps=3)
    _train(interrupted, host, "trainer.steps=2")
    resumed = _train(interrupted, host)
    assert resumed.resumed_from == 2
    # warm-up is counted across the restart: the 3rd update is the policy's first
    assert [h["train/critic_warmup"] for h in resumed.history] == [1.0, 1.0, 0.0]
    keys = ["rollout/success_rate", "train/loss", "train/value_loss", "train/value_mean"]
    for key in keys:
        assert resumed.history[2][key] == pytest.approx(straight.history[2][key], abs=1e-6)
    a = AutoModelForCausalLM.from_pretrained(straight.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    a, b = _critic_weights(straight.checkpoint), _critic_weights(resumed.checkpoint)
    assert a.keys() == b.keys()
    assert any(k.startswith("body.") for k in a) == (critic == "model")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_checkpoint_is_a_plain_hugging_face_folder(tmp_path, babyai_model):
    result = _train(_config(tmp_path, babyai_model, "plain", steps=2), PluginHost())
    assert (result.checkpoint / "config.json").is_file()
    assert (result.checkpoint / "trainer_state.pt").is_file()
    assert AutoModelForCausalLM.from_pretrained(result.checkpoint) is not None


LEARNERS = {
    "grpo": {"name": "grpo"},
    "ppo": {"name": "ppo"},
    "reinforce_pp": {"name": "reinforce_pp"},
    "reinforce_pp-baseline": {"name": "reinforce_pp", "baseline": True},
    "rloo": {"name": "rloo"},
}


def _learning_config(tmp_path: Path, model: Path, host: PluginHost, algorithm: dict):
    """GoToObj, 2 turns, 12 updates of 8 tasks x 4 samples; 60 held-out tasks."""
    path = _config(
        tmp_path,
        model,
        "learn",
        steps=12,
        tasks_per_step=8,
        group_size=4,
        lr=2e-3,
        checkpoint_every=0,
    )
    raw = yaml.safe_load(path.read_text())
    raw["algorithm"] = algorithm
    raw["env"].update(levels=["GoToObj"], instruction="Reach the goal.")
    raw["eval"] = {"num_tasks": 60, "max_turns": 2}
    path.write_text(yaml.safe_dump(raw))
    return load_config(path, [], host.registry)


@pytest.fixture(scope="module")
def untrained_success(tmp_path_factory, babyai_model) -> float:
    """Held-out success of the starting model, on the learning tests' eval set."""
    from agentgym_core.run.eval_stage import run_eval_stage

    host = PluginHost()
    resolved = _learning_config(
        tmp_path_factory.mktemp("before"), babyai_model, host, {"name": "grpo"}
    )
    metrics, _ = run_eval_stage(resolved, host, babyai_model)
    return metrics["success_rate"]


@pytest.mark.parametrize("name", list(LEARNERS))
def test_short_run_beats_the_untrained_model(tmp_path, babyai_model, untrained_success, name):
    """Each online algorithm, a few seeded updates on GoToObj: held-out success rises clearly."""
    from agentgym_core.run.eval_stage import run_eval_stage

    host = PluginHost()
    resolved = _learning_config(tmp_path, babyai_model, host, LEARNERS[name])
    trained = run_stage(resolved, host, show_progress=False)
    after, _ = run_eval_stage(resolved, host, trained.checkpoint)
    print(name, "success before", untrained_success, "after", after["success_rate"])
    assert after["success_rate"] >= untrained_success + 0.15, (untrained_success, after)


class FlakyBabyAI(BabyAIEnv):
    """BabyAI whose reset raises during the updates in `down` and for the tasks in `broken`."""

    down: set[int] = set()
    broken: set[int] = set()
    update = 0

    def reset(self, task_id):
        if FlakyBabyAI.update in FlakyBabyAI.down:
            raise ConnectionError(f"env server gone at update {FlakyBabyAI.update}")
        if task_id in FlakyBabyAI.broken:
            raise ValueError(f"task {task_id} is broken")
        return super().reset(task_id)


class FlakyPlugin:
    @hookimpl
    def agentgym_register_environments(self, register):
        register("flaky-babyai", FlakyBabyAI, config=BabyAIConfig)

    @hookimpl
    def agentgym_after_update(self, step, metrics):
        FlakyBabyAI.update = step + 1


def _flaky_run(tmp_path, model, agentgym_plugin, down: set[int], broken: set[int], out: str):
    FlakyBabyAI.down, FlakyBabyAI.broken, FlakyBabyAI.update = down, broken, 0
    host = agentgym_plugin(FlakyPlugin(), name="flaky")
    path = _config(tmp_path, model, out, steps=5, checkpoint_every=1)
    return _train(path, host, "env.name=flaky-babyai", "rollout.env_recovery_s=1")


def test_an_env_that_stays_down_stops_the_run_after_env_recovery_s(
    tmp_path, babyai_model, agentgym_plugin, capsys
):
    with pytest.raises(EnvironmentDown) as raised:
        _flaky_run(tmp_path, babyai_model, agentgym_plugin, {1, 2, 3, 4}, set(), "down")
    message = str(raised.value)
    assert message.startswith("update 2: 16 of 16 episodes ended in env_error")
    assert "env 'flaky-babyai' did not come back within rollout.env_recovery_s=1 s" in message
    assert "ConnectionError: env server gone at update 1" in message
    # the update played during the outage was not trained on and left no checkpoint
    checkpoints = tmp_path / "down" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000001"]
    assert message.endswith(f"the newest weights, {checkpoints / 'step-000001'}.")
    assert "once the env answers (waiting up to 1 s)" in capsys.readouterr().out


def test_env_errors_below_outage_fraction_are_left_out_not_waited_for(
    tmp_path, babyai_model, agentgym_plugin, capsys
):
    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj", "PickupDist"]))
    broken = set(env.tasks("train")[3::7])  # about one task in seven fails, always
    result = _flaky_run(tmp_path, babyai_model, agentgym_plugin, set(), broken, "broken")
    errors = [m["rollout/env_errors"] for m in result.history]
    assert len(result.history) == 5 and sum(errors) > 0
    assert all(e % 4 == 0 and e < 8 for e in errors)  # whole groups, under half the batch
    assert "waiting up to" not in capsys.readouterr().out


# -- rollouts ahead of the learner (trainer.max_staleness) ---------------------------------


class CrashAfterCheckpoint:
    """Stops a run right after the checkpoint of update `at` is written, like a killed job."""

    def __init__(self, at: int) -> None:
        self.at = at

    @hookimpl
    def agentgym_on_checkpoint(self, step, path):
        if step == self.at:
            raise KeyboardInterrupt(f"killed after checkpoint {step}")


def test_stale_rollouts_record_their_age_and_resume_exactly(tmp_path, babyai_model, cpu_contention):
    """max_staleness 1: every batch after the first is one update old; a run killed after a
    checkpoint resumes with the rollout that was in flight, exactly as if never stopped."""
    keys = ["rollout/success_rate", "rollout/generated_tokens", "train/loss"]
    keys += ["train/importance_weight_mean", "train/importance_weight_max"]
    host = PluginHost()
    straight = _train(_config(tmp_path, babyai_model, "straight", max_staleness=1), host)
    assert [h["rollout/staleness"] for h in straight.history] == [0.0, 1.0, 1.0, 1.0]
    assert all(0 < h["train/importance_weight_mean"] <= 2.0 for h in straight.history)
    assert straight.history[0]["train/importance_weight_max"] == pytest.approx(1.0, abs=1e-3)
    assert max(h["train/importance_weight_max"] for h in straight.history[1:]) > 1.0 + 1e-3

    interrupted = _config(tmp_path, babyai_model, "resumed", max_staleness=1)
    host.pm.register(CrashAfterCheckpoint(2), name="crash")
    with pytest.raises(KeyboardInterrupt):
        _train(interrupted, host)
    host.pm.unregister(name="crash")
    state = torch.load(
        tmp_path / "resumed" / "checkpoints" / "step-000002" / "trainer_state.pt",
        weights_only=False,
    )
    assert [(a["step"], a["version"]) for a in state["extra"]["ahead"]] == [(2, 1)]
    resumed = _train(interrupted, host)
    assert resumed.resumed_from == 2
    for step in (2, 3):
        assert resumed.history[step]["rollout/staleness"] == 1.0
        for key in keys:
            assert resumed.history[step][key] == pytest.approx(
                straight.history[step][key], abs=1e-6
            ), (step, key)
    a = AutoModelForCausalLM.from_pretrained(straight.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_rollouts_in_a_process_give_the_thread_s_batches(tmp_path, babyai_model, cpu_contention):
    """trainer.rollout_worker: process plays in a child process exactly what a thread plays."""
    host = PluginHost()
    keys = ["rollout/success_rate", "rollout/generated_tokens", "rollout/staleness", "train/loss"]
    thread = _train(_config(tmp_path, babyai_model, "thread", max_staleness=1, steps=3), host)
    process = _train(
        _config(tmp_path, babyai_model, "process", max_staleness=1, steps=3),
        host,
        "trainer.rollout_worker=process",
    )
    for a, b in zip(thread.history, process.history, strict=True):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    a = AutoModelForCausalLM.from_pretrained(thread.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(process.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_stale_rollouts_learn(tmp_path, babyai_model, untrained_success):
    """GRPO with rollouts one update ahead: held-out success rises as the synchronous run's."""
    from agentgym_core.run.eval_stage import run_eval_stage

    host = PluginHost()
    _learning_config(tmp_path, babyai_model, host, {"name": "grpo"})
    resolved = load_config(tmp_path / "learn.yaml", ["trainer.max_staleness=1"], host.registry)
    trained = run_stage(resolved, host, show_progress=False)
    assert {h["rollout/staleness"] for h in trained.history[1:]} == {1.0}
    after, _ = run_eval_stage(resolved, host, trained.checkpoint)
    print("stale 1: success before", untrained_success, "after", after["success_rate"])
    assert after["success_rate"] >= untrained_success + 0.15, (untrained_success, after)


class JitteryBabyAI:
    """BabyAI whose steps take a random few milliseconds: which requests share the sampler's
    batch then changes from run to run, as it does on a loaded machine."""

    @hookimpl
    def agentgym_register_environments(self, register):
        import random
        import time

        from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

        class Jittery(BabyAIEnv):
            def step(self, action):
                time.sleep(random.random() * 0.01)
                return super().step(action)

        register("jittery-babyai", Jittery, config=BabyAIConfig)


def test_stale_batches_weigh_the_same_however_the_sampler_batched_them(
    tmp_path, babyai_model, agentgym_plugin
):
    """Behaviour log-probabilities recomputed in one packed pass (`behaviour_logprobs`, auto
    for hf) depend on the batch alone: two stale runs whose sampler batched differently
    (random env latency) train to the same bits; a resumed one too."""
    host = agentgym_plugin(JitteryBabyAI(), name="jittery")
    runs = []
    for name in ("one", "two"):
        config = _config(tmp_path, babyai_model, name, max_staleness=1, steps=3)
        raw = yaml.safe_load(config.read_text())
        raw["env"]["name"] = "jittery-babyai"
        config.write_text(yaml.safe_dump(raw))
        runs.append(_train(config, host))
    one, two = runs
    for a, b in zip(one.history, two.history, strict=True):
        for key in ("train/loss", "train/importance_weight_mean", "train/grad_norm"):
            assert a[key] == b[key], key  # bit for bit
    x = AutoModelForCausalLM.from_pretrained(one.checkpoint).state_dict()
    y = AutoModelForCausalLM.from_pretrained(two.checkpoint).state_dict()
    assert all(torch.equal(x[k], y[k]) for k in x)
