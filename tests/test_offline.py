"""Offline training (SFT, DPO): sequence log-probs, update maths, stages, pipelines, learning."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.config.errors import ConfigError
from agentgym_core.config.load import load_config
from agentgym_core.config.stages import expand_stages
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.sequence import micro_batches, sequence_logprobs, sequence_update
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.eval_stage import run_eval_stage
from agentgym_core.run.kinds import run_stage
from agentgym_core.run.offline_data import step_indices
from agentgym_core.run.pipeline import run_pipeline
from agentgym_core.run.saved_rollouts import read_rollouts
from agentgym_core.types import Trajectory

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("agentgym_algo_sft")
pytest.importorskip("agentgym_algo_dpo")

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
INSTRUCTION = "Reach the goal."


def _seq(ids, mask, constraints=None) -> Trajectory:
    return Trajectory(
        task_id=0,
        group=0,
        token_ids=list(ids),
        loss_mask=list(mask),
        logprobs=[0.0] * len(ids),
        constraints=constraints or {},
    )


# -- summed sequence log-probabilities ---------------------------------------------------


class UniformLM(torch.nn.Module):
    """All-zero logits: every token has probability 1 / vocab (1 / k where k ids are allowed)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, input_ids, position_ids=None, use_cache=False, output_hidden_states=False):
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, -1), hidden_states=None)


def test_sequence_logprobs_by_hand():
    # 3 agent tokens among 6 -> 3 log(1/10); the second has positions 2, 3 constrained to
    # 2 and 5 ids -> log(1/2) + log(1/5) + log(1/10) for its unconstrained third agent token
    sequences = [
        _seq([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1]),
        _seq([7, 8, 1, 2, 3], [0, 0, 1, 1, 1], constraints={2: (1, 4), 3: (2, 3, 4, 5, 6)}),
        _seq([9, 9], [0, 1]),
    ]
    sums, counts = sequence_logprobs(UniformLM(10), sequences)
    assert counts.tolist() == [3.0, 3.0, 1.0]
    want = [3 * math.log(0.1), math.log(0.5) + math.log(0.2) + math.log(0.1), math.log(0.1)]
    assert sums.tolist() == pytest.approx(want, abs=1e-5)


def test_sequence_logprobs_weigh_each_token_by_its_mask_value():
    # sft.observation_loss: agent tokens weigh 1, the others 0.25 -> (2 + 3 x 0.25) log(1/10)
    sums, counts = sequence_logprobs(
        UniformLM(10), [_seq([1, 2, 3, 4, 5, 6], [0.25, 0.25, 1, 1, 0.25, 0.25])]
    )
    assert counts.tolist() == [2.75]
    assert sums.tolist() == pytest.approx([2.75 * math.log(0.1)], abs=1e-5)


def test_sequence_logprobs_match_one_plain_forward_per_sequence(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gen = torch.Generator().manual_seed(0)
    sequences = []
    for length in (40, 7, 23, 40, 12):
        ids = torch.randint(3, model.config.vocab_size, (length,), generator=gen).tolist()
        mask = (torch.rand(length, generator=gen) > 0.5).int().tolist()
        sequences.append(_seq(ids, mask))
    packed, _ = sequence_logprobs(model, sequences)
    with torch.no_grad():
        for seq, value in zip(sequences, packed, strict=True):
            logits = model(torch.tensor([seq.token_ids])).logits[0, :-1]
            chosen = torch.log_softmax(logits, -1).gather(
                1, torch.tensor(seq.token_ids[1:])[:, None]
            )
            want = (chosen[:, 0] * torch.tensor(seq.loss_mask[1:])).sum()
            assert float(value) == pytest.approx(float(want), abs=1e-4)


def test_micro_batches_keep_examples_whole_and_in_order():
    pair = lambda n: (_seq([1] * n, [0] + [1] * (n - 1)), _seq([1] * n, [0] + [1] * (n - 1)))  # noqa: E731
    examples = [pair(10), pair(10), pair(30), pair(5)]
    groups = micro_batches(examples, token_budget=45)
    assert [len(g) for g in groups] == [2, 1, 1]  # 40 | 60 alone (over budget) | 10
    assert [ex for g in groups for ex in g] == examples


def test_padded_micro_batches_go_longest_first_and_count_their_padding():
    one = lambda n: (_seq([1] * n, [0] + [1] * (n - 1)),)  # noqa: E731
    pair = lambda n, m: (_seq([1] * n, [0] + [1] * (n - 1)), _seq([1] * m, [0] + [1] * (m - 1)))  # noqa: E731
    examples = [one(5), pair(8, 30), one(10), one(6), one(9), one(4)]
    groups = micro_batches(examples, token_budget=40, padded=True)
    # the pair alone (2 rows x 30 = 60: over the budget, kept whole); then 10, 9, 6 and 5
    # pad to 4 rows x 10 = 40, the budget; 4 starts another group
    assert groups == [[pair(8, 30)], [one(10), one(9), one(6), one(5)], [one(4)]]
    assert micro_batches(examples, token_budget=10_000, padded=True) == [
        [pair(8, 30), one(10), one(9), one(6), one(5), one(4)]  # 7 rows x 30 = 210
    ]


def test_step_indices_cover_each_epoch_once_and_are_pure():
    seen = [i for step in range(6) for i in step_indices(step, 5, 10, seed=3)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert seen[:10] != seen[10:20]  # a new order each epoch
    assert step_indices(4, 5, 10, seed=3) == seen[20:25]  # the same batch whenever asked
    assert step_indices(0, 5, 10, seed=4) != seen[:5]


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")
@pytest.mark.parametrize(
    ("name", "options"), [("sft", {"files": ["x"]}), ("dpo", {"beta": 0.5, "pairs_from": "x"})]
)
def test_micro_batching_does_not_change_the_update(tiny_model_dir, name, options):
    """One step over 4 examples: in one micro-batch or in four, the same loss and gradient."""
    host = PluginHost()
    registration = host.registry.get("algorithm", name)
    algorithm = registration.factory(registration.config.model_validate(options))
    gen = torch.Generator().manual_seed(1)
    examples = []
    for length in (30, 18, 25, 9):
        seqs = []
        for _ in range(algorithm.sequences_per_example):
            ids = torch.randint(3, 200, (length,), generator=gen).tolist()
            seqs.append(_seq(ids, [0] * 4 + [1] * (length - 4)))
        examples.append(tuple(seqs))
    weights = []
    for budget in (10_000, 1):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        noise = torch.Generator().manual_seed(2)  # the same reference in both runs
        with torch.no_grad():  # differs from the policy, so DPO's loss is not flat
            for p in reference.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=noise))
        learner = Learner(
            model,
            algorithm,
            LearnerSettings(lr=1e-2, max_grad_norm=None),
            reference=reference if algorithm.needs.reference else None,
        )
        # plain SGD with lr 1: the new weights are w - gradient (Adam's first step is only its sign)
        learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1.0)
        metrics = sequence_update(learner, algorithm, examples, micro_batch_tokens=budget)
        weights.append((metrics["loss"], [p.detach().clone() for p in learner.model.parameters()]))
    (loss_a, a), (loss_b, b) = weights
    assert loss_a == pytest.approx(loss_b, rel=1e-4)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


def test_an_offline_update_gives_back_the_memory_it_freed(tiny_model_dir, monkeypatch):
    """Cloning's activations, freed, stayed in glibc's arenas (`benchmarks/heap_release.py`:
    about 3 GB resident between SmolLM2's cloning updates, 1 GB once given back)."""
    from agentgym_core.learner import learner as learner_module

    calls = []
    monkeypatch.setattr(learner_module, "release_freed_memory", lambda: calls.append(1))
    host = PluginHost()
    registration = host.registry.get("algorithm", "sft")
    algorithm = registration.factory(registration.config.model_validate({"files": ["x"]}))
    example = (_seq(list(range(3, 23)), [0] * 4 + [1] * 16),)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    learner = Learner(model, algorithm, LearnerSettings(lr=1e-3))
    sequence_update(learner, algorithm, [example], micro_batch_tokens=1000)
    assert calls == [1]


# -- real stages on BabyAI ---------------------------------------------------------------


@pytest.fixture(scope="module")
def babyai_model(tmp_path_factory) -> Path:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj"], list_actions=False, instruction=INSTRUCTION))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(texts, tmp_path_factory.mktemp("babyai"), TinyModelConfig(vocab_size=400))


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow store for the module's pipelines: a new store costs seconds of migrations."""
    from agentgym_core.tracking.mlflow_tracker import sqlite_uri

    return sqlite_uri(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def _config(tmp_path: Path, model: Path, name: str, algorithm: dict, **blocks) -> Path:
    raw = {
        "run": {"name": name, "output_dir": str(tmp_path / name), "seed": 0},
        "model": {"path": str(model)},
        "env": {
            "name": "babyai",
            "levels": ["GoToObj"],
            "list_actions": False,
            "instruction": INSTRUCTION,
        },
        "algorithm": algorithm,
        "trainer": {"steps": 4, "lr": 3e-3, "checkpoint_every": 0},
        "eval": {"num_tasks": 40, "max_turns": 8, "greedy": True},
        **blocks,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_sft_on_expert_trajectories_beats_the_untrained_model(tmp_path, babyai_model):
    """A few hundred BabyAIBot episodes, a short SFT run: greedy GoToObj success rises a lot."""
    host = PluginHost()
    sft = {"name": "sft", "expert": {"episodes": 300, "max_turns": 8}, "batch_size": 16}
    path = _config(
        tmp_path,
        babyai_model,
        "sft",
        sft,
        trainer={"steps": 60, "lr": 3e-3, "checkpoint_every": 0},
        eval={"num_tasks": 40, "max_turns": 10, "greedy": True},
    )
    resolved = load_config(path, [], host.registry)
    before, _ = run_eval_stage(resolved, host, babyai_model)
    trained = run_stage(resolved, host, show_progress=False)
    after, _ = run_eval_stage(resolved, host, trained.checkpoint)
    losses = [h["train/loss"] for h in trained.history]
    print("success before", before["success_rate"], "after", after["success_rate"], losses[::10])
    assert after["success_rate"] >= before["success_rate"] + 0.5, (before, after)
    assert losses[-1] < losses[0] / 2
    written = yaml.safe_load((tmp_path / "sft" / "expert.json").read_text())
    assert 200 < len(written) <= 300 and written[0]["item_id"].startswith("babyai_")
    # the data's price: every expert action, failed episodes' too, logged once for the stage
    kept_actions = sum(turn["loss"] is True for item in written for turn in item["conversations"])
    expert_steps = [h.get("data/expert_env_steps") for h in trained.history]
    assert expert_steps[0] >= kept_actions > 0
    assert expert_steps[0] <= kept_actions + 8 * (300 - len(written))
    assert expert_steps[1:] == [None] * (len(expert_steps) - 1)


def test_dpo_raises_the_chosen_minus_rejected_margin(tmp_path, babyai_model, mlflow_uri):
    """Sampled episodes saved by an eval stage; DPO on (success, failure) pairs of a task."""
    from agentgym_algo_dpo.loss import success_failure_pairs

    host = PluginHost()
    dpo = {"name": "dpo", "pairs_from": "sample", "beta": 0.5, "batch_size": 16}
    stages = [
        {
            "name": "sample",
            "type": "eval",
            "eval": {"split": "train", "num_tasks": 24, "k": 4, "greedy": False, "max_turns": 3},
            "tracking": {"save_rollouts": True},
        },
        {"name": "dpo", "type": "train", "trainer": {"steps": 8, "lr": 2e-3}},
    ]
    path = _config(
        tmp_path,
        babyai_model,
        "dpo",
        dpo,
        stages=stages,
        tracking={"log_trajectories": 0, "uri": mlflow_uri},
    )
    results = run_pipeline(load_config(path, [], host.registry), host, show_progress=False)
    rollouts = read_rollouts(tmp_path / "dpo" / "sample" / "rollouts")
    assert len(rollouts) == 24 * 4
    pairs = success_failure_pairs(rollouts, 4, seed=0)
    assert len(pairs) >= 8, "the untrained model should both win and lose some tasks"
    flat = [t for pair in pairs for t in pair]

    def margins(folder: Path) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():
            sums, _ = sequence_logprobs(model, flat)
        return sums[0::2] - sums[1::2]  # log pi(chosen) - log pi(rejected), per pair

    start, trained = margins(babyai_model), margins(results[1].model)
    gain = trained - start  # = the implicit reward margin / beta
    print("margin before", start.mean().item(), "after", trained.mean().item())
    assert gain.mean() > 1.0
    assert (gain > 0).float().mean() >= 0.8
    history = yaml.safe_load((tmp_path / "dpo" / "dpo" / "config.yaml").read_text())
    assert history["algorithm"]["name"] == "dpo"


def test_resumed_sft_continues_exactly(tmp_path, babyai_model):
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.data.agenttraj import parse_items, write_items
    from agentgym_core.data.expert import expert_items

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj"], list_actions=False, instruction=INSTRUCTION))
    raw = expert_items(env, "babyai", env.tasks("train")[:12], max_turns=8).items
    data = write_items(parse_items(raw), tmp_path / "data" / "expert.json")
    sft = {"name": "sft", "files": [str(tmp_path / "data" / "*.json")], "batch_size": 5}
    host = PluginHost()

    def train(name: str, *overrides: str):
        path = _config(
            tmp_path, babyai_model, name, sft, trainer={"steps": 4, "checkpoint_every": 2}
        )
        return run_stage(
            load_config(path, list(overrides), host.registry), host, show_progress=False
        )

    straight = train("straight")
    assert train("resumed", "trainer.steps=2").resumed_from == 0
    resumed = train("resumed")
    assert resumed.resumed_from == 2
    for step in (2, 3):
        assert resumed.history[step]["train/loss"] == pytest.approx(
            straight.history[step]["train/loss"], abs=1e-6
        )
    a = AutoModelForCausalLM.from_pretrained(straight.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert AutoTokenizer.from_pretrained(resumed.checkpoint) is not None
    again = train("resumed")  # a finished stage run again trains nothing and keeps its result
    assert (again.resumed_from, again.checkpoint, len(again.history)) == (4, resumed.checkpoint, 4)
    assert data.is_file()


# -- errors --------------------------------------------------------------------------------


def test_pairs_from_must_name_an_earlier_stage_that_saves_rollouts(tmp_path, babyai_model):
    host = PluginHost()
    dpo = {"name": "dpo", "pairs_from": "sample"}
    stages = [
        {"name": "sample", "type": "eval", "eval": {"split": "train"}},
        {"name": "dpo", "type": "train"},
        {"name": "late", "type": "train", "algorithm": {"name": "dpo", "pairs_from": "test"}},
        {"name": "test", "type": "eval"},
    ]
    path = _config(tmp_path, babyai_model, "bad", dpo, stages=stages)
    with pytest.raises(ConfigError) as info:  # each stage's kind checks it before anything runs
        expand_stages(load_config(path, [], host.registry))
    message = str(info.value)
    assert "stages.1.algorithm.pairs_from: stage 'sample' does not save its rollouts; " in message
    assert "set stages.0.tracking.save_rollouts: true" in message
    assert (
        "stages.2.algorithm.pairs_from: no earlier stage named 'test' (earlier: sample, dpo)"
        in message
    )


def test_data_errors_name_the_key_file_item_and_field(tmp_path, babyai_model):
    host = PluginHost()
    sft = {"name": "sft", "files": ["missing/*.json"]}
    path = _config(tmp_path, babyai_model, "nofile", sft)
    with pytest.raises(
        ConfigError, match=r"algorithm\.files\.0: no file matches 'missing/\*\.json'"
    ):
        run_stage(load_config(path, [], host.registry), host, show_progress=False)
    broken = tmp_path / "broken.json"
    broken.write_text(
        '[{"item_id": "a", "conversations": [{"from": "human", "value": "x"}, {"from": "gpt"}]}]'
    )
    path = _config(tmp_path, babyai_model, "badfile", {"name": "sft", "files": [str(broken)]})
    with pytest.raises(ConfigError) as info:
        run_stage(load_config(path, [], host.registry), host, show_progress=False)
    assert f"algorithm: {broken}: item 0: conversations[1].value: expected a string" in str(
        info.value
    )
    path = _config(
        tmp_path, babyai_model, "badenv", {"name": "sft", "expert": {"env": {"levels": ["Nope"]}}}
    )
    with pytest.raises(ConfigError, match=r"algorithm\.expert\.env\.levels: unknown level 'Nope'"):
        run_stage(load_config(path, [], host.registry), host, show_progress=False)


def test_an_offline_stage_needs_no_scheduler(tmp_path, babyai_model):
    host = PluginHost()
    stages = [
        {"name": "sft", "type": "train"},
        {"name": "grpo", "type": "train", "algorithm": {"name": "grpo"}},
    ]
    path = _config(
        tmp_path, babyai_model, "nosched", {"name": "sft", "files": ["x.json"]}, stages=stages
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, [], host.registry)
    assert "stages.1.scheduler: a train stage needs scheduler" in str(info.value)
    assert "stages.0" not in str(info.value)


# -- the shipped pipelines, with tiny overrides ------------------------------------------------


TINY = [
    "env.levels=[GoToObj]",
    "eval.num_tasks=4",
    "rollout.concurrency=16",
    "tracking.log_trajectories=0",
]


def test_shipped_sft_grpo_pipeline_runs_and_chains_checkpoints(tmp_path, babyai_model, mlflow_uri):
    host = PluginHost()
    overrides = [
        f"model.path={babyai_model}",
        f"run.output_dir={tmp_path / 'sft-grpo'}",
        f"tracking.uri={mlflow_uri}",
        *TINY,
        "trainer.steps=2",
        "trainer.tasks_per_step=2",
        "trainer.group_size=2",
        "stages.0.algorithm.expert.episodes=12",
        "stages.0.trainer.steps=2",
        "stages.1.tracking.save_rollouts=true",
    ]
    resolved = load_config(CONFIGS / "babyai-sft-grpo.yaml", overrides, host.registry)
    results = run_pipeline(resolved, host, show_progress=False)
    assert [(r.name, r.type) for r in results] == [
        ("sft", "train"),
        ("grpo", "train"),
        ("test", "eval"),
    ]
    assert results[0].model == tmp_path / "sft-grpo" / "sft" / "checkpoints" / "step-000002"
    assert results[1].model == tmp_path / "sft-grpo" / "grpo" / "checkpoints" / "step-000002"
    assert results[2].model == results[1].model
    assert "train/token_nll" in results[0].metrics and "rollout/success_rate" in results[1].metrics
    assert "success_rate" in results[2].metrics
    saved = tmp_path / "sft-grpo" / "grpo" / "rollouts"  # one file per update of the grpo stage
    assert sorted(p.name for p in saved.iterdir()) == ["step-000000.jsonl", "step-000001.jsonl"]
    rollouts = read_rollouts(saved)
    assert len(rollouts) == 2 * 2 * 2 and all(t.num_sampled_tokens > 0 for t in rollouts)
    assert not (tmp_path / "sft-grpo" / "sft" / "rollouts").exists()


def test_shipped_dpo_pipeline_runs(tmp_path, babyai_model, mlflow_uri):
    host = PluginHost()
    overrides = [
        f"model.path={babyai_model}",
        f"run.output_dir={tmp_path / 'dpo'}",
        f"tracking.uri={mlflow_uri}",
        *TINY,
        "eval.max_turns=3",
        "stages.0.algorithm.expert.episodes=12",
        "stages.0.trainer.steps=2",
        "stages.1.eval.num_tasks=8",
        "stages.2.trainer.steps=2",
    ]
    resolved = load_config(CONFIGS / "babyai-dpo.yaml", overrides, host.registry)
    results = run_pipeline(resolved, host, show_progress=False)
    assert [r.name for r in results] == ["sft", "sample", "dpo", "test"]
    assert results[1].model == results[0].model  # the samples come from the sft checkpoint
    assert results[2].model == tmp_path / "dpo" / "dpo" / "checkpoints" / "step-000002"
    assert "train/reward_margin" in results[2].metrics
    assert len(list((tmp_path / "dpo" / "sample" / "rollouts").glob("eval-train.jsonl"))) == 1


@pytest.mark.parametrize(
    "options",
    [{"levels": ["GoToObj", "GoToLocal"]}, {"levels": "agentgym", "expert_search": 1}],
    ids=["bot", "agentgym-search"],
)
def test_expert_episodes_shared_among_processes_are_those_of_one(options):
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    from agentgym_core.data.expert import expert_items, expert_items_in_processes

    config = BabyAIConfig(list_actions=False, instruction=INSTRUCTION, **options)
    env = make_babyai(config)
    try:
        tasks = env.tasks("train")[:7]
        alone = expert_items(env, "babyai", tasks, max_turns=12)
    finally:
        env.close()
    shared = expert_items_in_processes(
        functools.partial(make_babyai, config), "babyai", tasks, workers=2, max_turns=12
    )
    assert alone.successes > 0 and alone.env_steps > 7
    assert shared == alone  # the same items in the same order, the same counts


def test_an_sft_stage_shares_its_expert_episodes_among_processes_as_asked(
    tmp_path, babyai_model, monkeypatch
):
    """`algorithm.expert.workers` reaches the processes; the stage's data is one process's."""
    from agentgym_core.run import offline_data as offline

    shares = []
    in_processes = offline.expert_items_in_processes

    def counted(*args, **kwargs):
        shares.append(kwargs["workers"])
        return in_processes(*args, **kwargs)

    monkeypatch.setattr(offline, "expert_items_in_processes", counted)
    host = PluginHost()
    written, steps = {}, {}
    for workers in (1, 2):
        expert = {"episodes": 10, "max_turns": 8, "workers": workers}
        name = f"sft-{workers}"
        path = _config(
            tmp_path,
            babyai_model,
            name,
            {"name": "sft", "expert": expert, "batch_size": 4},
            trainer={"steps": 1, "checkpoint_every": 0},
        )
        trained = run_stage(load_config(path, [], host.registry), host, show_progress=False)
        written[workers] = (tmp_path / name / "expert.json").read_text()
        steps[workers] = trained.history[0]["data/expert_env_steps"]
    assert shares == [2]
    assert written[1] == written[2] and len(yaml.safe_load(written[1])) > 0
    assert steps[1] == steps[2] > 0


def test_an_sft_stage_trains_on_relabelled_copies_of_its_expert_episodes(
    tmp_path, babyai_model, monkeypatch
):
    """`relabel_copies`: each kept episode and its copies with BabyAI's colours permuted."""
    host = PluginHost()
    expert = {"episodes": 10, "max_turns": 8}
    sft = {"name": "sft", "expert": expert, "batch_size": 4, "relabel_copies": 3}
    path = _config(
        tmp_path, babyai_model, "relabel", sft, trainer={"steps": 1, "checkpoint_every": 0}
    )
    trained = run_stage(load_config(path, [], host.registry), host, show_progress=False)
    kept = len(yaml.safe_load((tmp_path / "relabel" / "expert.json").read_text()))
    assert kept > 0
    assert trained.history[0]["data/relabelled_copies"] == 3 * kept
    assert trained.history[0]["data/examples"] == 4 * kept  # none too long for the context

    from agentgym_env_babyai.env import BabyAIEnv

    monkeypatch.delattr(BabyAIEnv, "interchangeable_words")
    path = _config(tmp_path, babyai_model, "norelabel", sft)
    with pytest.raises(ConfigError, match=r"algorithm\.relabel_copies: environment 'babyai' names"):
        run_stage(load_config(path, [], host.registry), host, show_progress=False)


def test_an_sft_stage_with_observation_loss_learns_the_observations_too(tmp_path, babyai_model):
    """`observation_loss`: same episodes, same updates, the env's text predicted far better."""
    from agentgym_core.data.agenttraj import read_items, tokenize
    from agentgym_core.rollout.chat import ChatFormat

    host = PluginHost()
    expert = {"episodes": 40, "max_turns": 8}
    nll = {}
    for weight in (0.0, 0.5):
        name = f"obs{weight}"
        sft = {"name": "sft", "expert": expert, "batch_size": 8, "observation_loss": weight}
        trainer = {"steps": 20, "lr": 3e-3, "checkpoint_every": 0}
        path = _config(tmp_path, babyai_model, name, sft, trainer=trainer)
        trained = run_stage(load_config(path, [], host.registry), host, show_progress=False)
        model = AutoModelForCausalLM.from_pretrained(trained.checkpoint)
        chat = ChatFormat(AutoTokenizer.from_pretrained(trained.checkpoint))
        sequences = []
        for item in read_items(tmp_path / name / "expert.json"):
            ids, agent = tokenize(chat, item.conversations)
            sequences.append(_seq(ids, [1 - m for m in agent]))  # the env's tokens, not the agent's
        with torch.no_grad():
            sums, counts = sequence_logprobs(model, sequences)
        nll[weight] = float(-sums.sum() / counts.sum())
    print("observation NLL per token by weight", nll)
    assert nll[0.5] < 0.5 * nll[0.0], nll


def test_an_sft_stage_adds_the_experts_takeovers_of_its_models_own_episodes(tmp_path, babyai_model):
    """`expert.roll_in`: the starting model plays, the bot finishes; its turns are context."""
    host = PluginHost()
    expert = {"episodes": 6, "max_turns": 8, "roll_in": {"episodes": 12, "max_turns": 6}}
    path = _config(
        tmp_path,
        babyai_model,
        "dagger",
        {"name": "sft", "expert": expert, "batch_size": 4},
        trainer={"steps": 1, "checkpoint_every": 0},
    )
    trained = run_stage(load_config(path, [], host.registry), host, show_progress=False)
    metrics = trained.history[0]
    takeovers = yaml.safe_load((tmp_path / "dagger" / "takeover.json").read_text())
    bot = yaml.safe_load((tmp_path / "dagger" / "expert.json").read_text())
    assert metrics["data/takeovers_played"] == 12
    assert 0 < metrics["data/takeovers_kept"] == len(takeovers) <= metrics["data/takeovers_cut"]
    assert metrics["data/takeovers_diverged"] == 0
    assert metrics["data/examples"] == len(bot) + len(takeovers)
    # the model's turns: 12 episodes of 1-6 actions each
    assert 12 <= metrics["data/roll_in_env_steps"] <= 72
    for item in takeovers:
        actions = [turn for turn in item["conversations"][3:] if turn["from"] == "gpt"]
        cut = item["roll_in_turns"]
        assert cut >= 1 and len(actions) > cut
        assert [turn["loss"] for turn in actions] == [False] * cut + [True] * (len(actions) - cut)


def test_a_roll_in_without_its_episodes_names_the_key(tmp_path, babyai_model):
    host = PluginHost()
    expert = {"episodes": 6, "roll_in": {"max_turns": 6}}
    path = _config(tmp_path, babyai_model, "dagger-bad", {"name": "sft", "expert": expert})
    with pytest.raises(ConfigError, match=r"algorithm\.expert\.roll_in\.episodes"):
        load_config(path, [], host.registry)


def test_a_resumed_roll_in_stage_takes_over_the_same_episodes(tmp_path, babyai_model, monkeypatch):
    """A resumed stage's data is the first run's: it reuses the kept roll_in.jsonl without
    playing, and where that file is gone the starting model plays again (not the checkpoint
    the learner resumes from, whose play would differ)."""
    from agentgym_core.run import offline

    host = PluginHost()
    expert = {"episodes": 4, "max_turns": 8, "roll_in": {"episodes": 12, "max_turns": 6}}
    sft = {"name": "sft", "expert": expert, "batch_size": 4}
    trainer = {"steps": 3, "checkpoint_every": 1, "lr": 3e-2}
    path = _config(tmp_path, babyai_model, "resumed", sft, trainer=trainer)
    folder = tmp_path / "resumed"

    def train(steps: int):
        config = load_config(path, [f"trainer.steps={steps}"], host.registry)
        return run_stage(config, host, show_progress=False).resumed_from

    assert train(1) == 0
    written = (folder / "takeover.json").read_text()
    assert len(yaml.safe_load(written)) > 0 and (folder / "roll_in.jsonl").is_file()

    def no_play(*args, **kwargs):
        raise AssertionError("played again")

    with monkeypatch.context() as patch:
        patch.setattr(offline, "evaluate_model", no_play)
        assert train(2) == 1  # the kept episodes: nothing played
    assert (folder / "takeover.json").read_text() == written
    (folder / "roll_in.jsonl").unlink()
    assert train(3) == 2  # played again, by the starting weights
    assert (folder / "takeover.json").read_text() == written


def test_an_sft_stage_evaluates_every_n_updates_on_the_eval_block(tmp_path, babyai_model):
    """`trainer.eval_every` in an offline stage: the eval block's split, reported to the hooks."""
    from agentgym_core import hookimpl

    class Evaluations:
        def __init__(self) -> None:
            self.seen: list[tuple[int, str, float]] = []

        @hookimpl
        def agentgym_after_evaluation(self, step, split, metrics):
            self.seen.append((step, split, metrics["episodes"]))

    host = PluginHost()
    recorder = Evaluations()
    host.pm.register(recorder)
    sft = {"name": "sft", "expert": {"episodes": 6, "max_turns": 8}, "batch_size": 4}
    trainer = {"steps": 4, "checkpoint_every": 0, "eval_every": 2}
    blocks = {"trainer": trainer, "eval": {"split": "test", "num_tasks": 5, "max_turns": 4}}
    path = _config(tmp_path, babyai_model, "sft-evals", sft, **blocks)
    run_stage(load_config(path, [], host.registry), host, show_progress=False)
    assert recorder.seen == [(2, "test", 5.0), (4, "test", 5.0)]
