"""AgentEvol (`type: evolve` stages): what is kept, the rounds, resuming, and config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agentgym_core import hookimpl
from agentgym_core.config.errors import ConfigError
from agentgym_core.config.load import load_config
from agentgym_core.config.stages import expand_stages
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.checkpoint import latest_checkpoint, load_trainer_state
from agentgym_core.run.evolve import kept_episodes
from agentgym_core.run.pipeline import run_pipeline
from agentgym_core.run.saved_rollouts import read_rollouts
from agentgym_core.types import Termination, Trajectory

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("agentgym_algo_sft")

INSTRUCTION = "Reach the goal."


def _episode(task, reward, success, termination=Termination.DONE, sampled=1) -> Trajectory:
    return Trajectory(
        task_id=task,
        group=0,
        token_ids=[1, 2],
        loss_mask=[0, sampled],
        reward=reward,
        success=success,
        termination=termination,
    )


def test_kept_episodes_by_hand():
    played = [
        _episode(0, 0.0, False),
        _episode(0, 0.9, True),  # kept: task 0's first success
        _episode(0, 0.8, True),  # task 0 has its one already
        _episode(1, 0.3, False),  # not a success...
        _episode(2, 1.0, True, Termination.ENV_ERROR),  # never kept
        _episode(3, 0.7, True, sampled=0),  # no agent tokens: nothing to train on
        _episode(4, 0.6, True),  # kept
    ]
    assert [(t.task_id, t.reward) for t in kept_episodes(played, min_reward=None, per_task=1)] == [
        (0, 0.9),
        (4, 0.6),
    ]
    assert [(t.task_id, t.reward) for t in kept_episodes(played, min_reward=None, per_task=2)] == [
        (0, 0.9),
        (0, 0.8),
        (4, 0.6),
    ]
    # ...but a reward of at least min_reward is, success or not
    assert [(t.task_id, t.reward) for t in kept_episodes(played, min_reward=0.3, per_task=1)] == [
        (0, 0.9),
        (1, 0.3),
        (4, 0.6),
    ]


@pytest.fixture(scope="module")
def babyai_model(tmp_path_factory) -> Path:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj"], list_actions=False, instruction=INSTRUCTION))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(texts, tmp_path_factory.mktemp("babyai"), TinyModelConfig(vocab_size=400))


def _config(tmp_path: Path, model: Path, algorithm: dict, evolve: dict, name="evolve") -> Path:
    raw = {
        "run": {"name": name, "output_dir": str(tmp_path / name), "seed": 0},
        "model": {"path": str(model)},
        "env": {
            "name": "babyai",
            "levels": ["GoToObj"],
            "list_actions": False,
            "instruction": INSTRUCTION,
        },
        "trainer": {"steps": 5, "lr": 3e-3, "checkpoint_every": 0},
        "eval": {"max_turns": 8},
        "tracking": {"log_trajectories": 0, "traces": False},
        "stages": [{"name": "evolve", "type": "evolve", "algorithm": algorithm, "evolve": evolve}],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


class Steps:
    """Records the update numbers the hooks see."""

    def __init__(self) -> None:
        self.updates: list[int] = []
        self.evaluations: list[tuple[int, str]] = []

    @hookimpl
    def agentgym_after_update(self, step, metrics):
        self.updates.append(step)

    @hookimpl
    def agentgym_after_evaluation(self, step, split, metrics):
        self.evaluations.append((step, split))


def test_evolve_rounds_explore_keep_fine_tune_and_resume(tmp_path, babyai_model):
    """Two rounds after cloning: each explores with the newest model and trains on expert + kept."""
    sft = {"name": "sft", "expert": {"episodes": 16, "max_turns": 8}, "batch_size": 8}
    evolve = {"iterations": 2, "num_tasks": 10, "samples": 3, "greedy": False, "max_turns": 8}
    path = _config(tmp_path, babyai_model, sft, evolve)
    host = PluginHost()
    steps = Steps()
    host.pm.register(steps)
    resolved = load_config(path, [], host.registry)
    [result] = run_pipeline(resolved, host, show_progress=False)

    stage = tmp_path / "evolve" / "evolve"
    experts = len(json.loads((stage / "round-0" / "expert.json").read_text()))
    assert 10 < experts <= 16
    kept_so_far = 0
    for round_index in (1, 2):
        folder = stage / f"round-{round_index}"
        explored = json.loads((folder / "explore.json").read_text())
        kept = read_rollouts_file(folder / "kept.jsonl")
        assert explored["evolve/episodes"] == 30
        assert explored["evolve/kept"] == len(kept) > 0
        assert all(t.success for t in kept)
        assert len({t.task_id for t in kept}) == len(kept)  # one per task and round
        assert {t.task_id for t in kept} <= set(_train_ids(resolved)[:10])
        kept_so_far += len(kept)
        examples = _examples(folder)
        assert examples == experts + kept_so_far, (round_index, examples, experts, kept_so_far)
    assert result.model.parent.parent == stage / "round-2"
    assert steps.updates == list(range(15))  # 3 rounds of 5, numbered on
    assert steps.evaluations == [(5, "explore-1"), (10, "explore-2")]

    # run again: nothing is explored or trained twice, the same weights come out
    stamp = (stage / "round-1" / "explore.json").stat().st_mtime_ns
    again = PluginHost()
    [result_again] = run_pipeline(load_config(path, [], again.registry), again, show_progress=False)
    assert result_again.model == result.model
    assert (stage / "round-1" / "explore.json").stat().st_mtime_ns == stamp


def read_rollouts_file(path: Path) -> list[Trajectory]:
    return [Trajectory.from_dict(json.loads(line)) for line in path.read_text().splitlines()]


def _train_ids(resolved) -> list:
    from agentgym_core.run.components import build_components

    env = build_components(resolved).env_factory()
    try:
        return list(env.tasks("train"))
    finally:
        env.close()


def _examples(folder: Path) -> int:
    """The example count a round's fine-tune trained on (from its checkpoint's history)."""
    state = load_trainer_state(latest_checkpoint(folder))
    return int(state["history"][-1]["data/examples"])


@pytest.mark.parametrize("restart", ["start", "previous"])
def test_evolve_fine_tunes_from_the_start_or_the_previous_round(
    tmp_path, babyai_model, monkeypatch, restart
):
    """`restart: start` (AgentGym's) trains each round from the stage's model; `previous` chains."""
    import agentgym_core.run.evolve as evolve_module

    starts, original = [], evolve_module.OfflineStage

    def recording(context):
        starts.append(Path(context.start_model))
        return original(context)

    monkeypatch.setattr(evolve_module, "OfflineStage", recording)
    sft = {"name": "sft", "expert": {"episodes": 8, "max_turns": 8}, "batch_size": 4}
    evolve = {"iterations": 1, "num_tasks": 4, "max_turns": 8, "restart": restart}
    path = _config(tmp_path, babyai_model, sft, evolve, name=restart)
    host = PluginHost()
    [result] = run_pipeline(load_config(path, [], host.registry), host, show_progress=False)
    round_0 = latest_checkpoint(tmp_path / restart / "evolve" / "round-0")
    assert starts == [babyai_model, babyai_model if restart == "start" else round_0]
    assert result.model == latest_checkpoint(tmp_path / restart / "evolve" / "round-1")


def test_an_evolve_stage_needs_an_offline_algorithm_that_reads_trajectories(tmp_path, babyai_model):
    host = PluginHost()
    path = _config(tmp_path, babyai_model, {"name": "grpo"}, {"iterations": 1}, name="bad")
    with pytest.raises(ConfigError) as raised:
        expand_stages(load_config(path, [], host.registry))
    assert "stages.0.algorithm.name" in str(raised.value)
    assert "reads saved trajectories" in str(raised.value)


def test_sft_reads_saved_trajectories_and_names_the_key_when_none_match(tmp_path, babyai_model):
    host = PluginHost()
    sft = {"name": "sft", "trajectories": [str(tmp_path / "nothing-*.jsonl")]}
    raw = yaml.safe_load(_config(tmp_path, babyai_model, sft, {}, name="sftfiles").read_text())
    raw["stages"][0]["type"] = "train"
    path = tmp_path / "sftfiles.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as raised:
        run_pipeline(load_config(path, [], host.registry), host, show_progress=False)
    assert "stages.0.algorithm.trajectories.0" in str(raised.value)
    assert read_rollouts(tmp_path) == []
