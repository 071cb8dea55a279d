"""Two GRPO updates of a tiny from-scratch model on the search env, through the real trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from agentgym_env_search import SearchConfig, SearchEnv
from agentgym_env_search.env import INVALID
from transformers import AutoModelForCausalLM

from agentgym_core import hookimpl
from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.train import TrainStage
from agentgym_core.types import Termination

ENV = {"name": "search", "top_k": 1, "max_passage_chars": 120}


@pytest.fixture(scope="module")
def search_model(tmp_path_factory, search_cache) -> Path:
    """A tiny model whose tokenizer saw the env's text and the expert's actions."""
    options = {k: v for k, v in ENV.items() if k != "name"}
    env = SearchEnv(SearchConfig(cache_dir=str(search_cache), **options))
    tasks = env.tasks("train")[:30]
    texts = env_corpus(env, tasks, max_turns=2)
    for task in tasks:
        env.reset(task)
        for _ in range(5):
            action = env.expert_action()
            texts.append(action)
            if env.step(action).done:
                break
    out = tmp_path_factory.mktemp("search-model")
    return init_model(texts, out, TinyModelConfig(vocab_size=400))


class BatchRecorder:
    """Keeps every rollout batch the trainer produced."""

    def __init__(self) -> None:
        self.batches = []

    @hookimpl
    def agentgym_after_rollout(self, step, batch, metrics):
        self.batches.append(batch)


def test_two_grpo_updates_run_on_search_episodes(tmp_path, search_model, search_cache, monkeypatch):
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", "search,grpo,fixed")  # only what the run uses
    raw = {
        "run": {"name": "search-smoke", "output_dir": str(tmp_path / "run"), "seed": 1},
        "model": {"path": str(search_model)},
        "env": {**ENV, "cache_dir": str(search_cache)},
        # entropy_coef: an untrained model never answers right, so every group's rewards tie
        # and GRPO's advantages are 0; the entropy bonus still gives the update a gradient.
        "algorithm": {"name": "grpo", "entropy_coef": 0.01},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 640, "max_new_tokens": 12, "constrained": False},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "lr": 1e-3},
        "tracking": {"log_trajectories": 0, "traces": False},
    }
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(raw))
    recorder = BatchRecorder()
    host = PluginHost(extra_plugins={"recorder": recorder})
    result = TrainStage(load_config(path, [], host.registry), host).run(show_progress=False)

    assert len(result.history) == 2 and len(recorder.batches) == 2
    for metrics in result.history:
        assert metrics["rollout/episodes"] == 4 and metrics["rollout/env_errors"] == 0
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    trajectories = [t for batch in recorder.batches for t in batch]
    assert {t.task_group for t in trajectories} <= {"single", "multi"}
    assert all(t.termination != Termination.ENV_ERROR for t in trajectories)
    # a second turn means the env's observation was appended and generation went on after it
    assert any(t.num_turns == 2 and t.termination == Termination.HORIZON for t in trajectories)
    turns = [turn for t in trajectories for turn in t.turns]
    assert turns and all(
        turn.observation == INVALID
        or turn.observation.startswith(("Results of search[", "No passage", "Your answer"))
        or "needs text inside the brackets" in turn.observation
        for turn in turns
    )
    before = AutoModelForCausalLM.from_pretrained(search_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
