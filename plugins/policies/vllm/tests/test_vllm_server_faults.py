"""What a review of the `vllm_server` policy found, each against real `vllm serve` replicas.

- a replica restarted between two turns is noticed at the next turn and reloaded before it
  samples (it came back with the weights it was started from);
- an HTTP 5xx from a replica moves the turn to another (it stopped the run); a turn every
  replica refuses with a 5xx stops at once, naming the error;
- a replica down when the policy is built is used once it answers, after a reload and its
  probe (the policy refused to build);
- with two learner ranks, a replica rank 0 skipped at a sync (it thought it down) is down for
  the other rank too, which reloads it before generating on it (it generated on old weights).

Run by `make test-vllm`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed here; `make test-vllm` builds .venv-vllm and runs these"
)

import httpx  # noqa: E402
import torch  # noqa: E402
from agentgym_policy_vllm.config import VLLMServerPolicyConfig  # noqa: E402
from agentgym_policy_vllm.launch import signal_replica, start_replicas, stop  # noqa: E402
from agentgym_policy_vllm.server import ServerPolicyError, VLLMServerPolicy  # noqa: E402

from agentgym_core.config.errors import ConfigError  # noqa: E402
from agentgym_core.interfaces import SamplingParams  # noqa: E402
from agentgym_core.rollout.chat import ChatFormat  # noqa: E402

pytestmark = pytest.mark.vllm


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_server_tests = _sibling("test_vllm_server")
CPU_FLAGS, free_port_pair = _server_tests.CPU_FLAGS, _server_tests.free_port_pair
continuation_logprobs = _server_tests.continuation_logprobs
replicas = _server_tests.replicas  # the fixture: two replicas for this module
ACTIONS = ["turn left", "turn right", "go forward"]


def _learner(vllm_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    prompt = ChatFormat(tokenizer, model.generation_config).prompt_ids(
        "Reach the goal.", "You see a red ball in front of you."
    )
    return model, tokenizer, prompt


def _perturb(model, seed: int = 0) -> None:
    """Weights no replica was started from."""
    torch.manual_seed(seed)
    with torch.no_grad():
        embeddings = model.model.embed_tokens.weight
        embeddings.add_(0.05 * torch.randn_like(embeddings))


def _turn(policy, prompt, session: str):
    return asyncio.run(policy.generate(prompt, SamplingParams(seed=3), ACTIONS, session=session))


def test_a_replica_restarted_between_two_turns_is_reloaded_before_it_samples(
    vllm_model_dir, tmp_path
):
    model, tokenizer, prompt = _learner(vllm_model_dir)
    port, log = free_port_pair(), (tmp_path / "replica.log").open("w")
    processes, urls = start_replicas(str(vllm_model_dir), 1, port, extra=CPU_FLAGS, log=log)
    try:
        policy = VLLMServerPolicy(
            VLLMServerPolicyConfig(base_urls=urls), model=model, tokenizer=tokenizer
        )
        _perturb(model)
        policy.sync_weights(model)
        current = continuation_logprobs(model, prompt)
        assert _turn(policy, prompt, "before").text in ACTIONS
        signal_replica(processes[0], signal.SIGKILL)  # its supervisor restarts it, between turns
        processes[0].wait(30)
        processes.extend(start_replicas(str(vllm_model_dir), 1, port, extra=CPU_FLAGS, log=log)[0])
        assert _turn(policy, prompt, "after").text in ACTIONS
        served = policy.served_logprobs(urls[0], prompt)  # the learner's, not the folder's
        assert served == pytest.approx(current, abs=1e-3)
        assert policy.counters()["restarts"] == 1
        assert _turn(policy, prompt, "after").text in ACTIONS  # answered just now: not asked
        assert policy.counters()["restarts"] == 1
    finally:
        policy.close()
        stop(processes)
        log.close()


class FailingProxy:
    """A real HTTP server in front of a replica that answers 500 to completions when told."""

    def __init__(self, target: str, port: int = 0) -> None:
        self.failing = False
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.failing and self.path.startswith("/v1/completions"):
                    status, content = 500, b'{"error": "EngineDeadError"}'
                else:
                    reply = httpx.request(
                        method,
                        target + self.path,
                        content=body,
                        headers={"content-type": "application/json"},
                        timeout=300,
                    )
                    status, content = reply.status_code, reply.content
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_server_error_moves_the_turn_to_another_replica(replicas, vllm_model_dir):
    model, tokenizer, prompt = _learner(vllm_model_dir)
    proxy = FailingProxy(replicas[1])
    policy = VLLMServerPolicy(
        VLLMServerPolicyConfig(base_urls=[proxy.url, replicas[0]], outage_s=60),
        model=model,
        tokenizer=tokenizer,
    )
    alone = VLLMServerPolicy(
        VLLMServerPolicyConfig(base_urls=[proxy.url], outage_s=600),
        model=model,
        tokenizer=tokenizer,
    )
    try:
        assert _turn(policy, prompt, "episode").text in ACTIONS  # on the proxy's replica
        assert policy._sessions["episode"] == proxy.url
        proxy.failing = True
        assert _turn(policy, prompt, "episode").text in ACTIONS  # moved, not stopped
        assert policy.counters()["failovers"] == 1
        assert policy._sessions["episode"] == replicas[0]
        started = time.monotonic()
        with pytest.raises(ServerPolicyError, match="every replica answered this turn.*500"):
            _turn(alone, prompt, "refused")
        assert time.monotonic() - started < 60  # not the 600 s outage wait
    finally:
        proxy.failing = False
        policy.close()
        alone.close()
        proxy.close()


def test_a_replica_rank_0_skipped_at_a_sync_is_reloaded_by_the_other_rank(
    replicas, vllm_model_dir, tmp_path, monkeypatch
):
    model, tokenizer, prompt = _learner(vllm_model_dir)
    weights = tmp_path / "weights"
    monkeypatch.setenv("WORLD_SIZE", "2")

    def rank(number: int) -> VLLMServerPolicy:
        monkeypatch.setenv("RANK", str(number))  # read in the constructor, before it waits
        config = VLLMServerPolicyConfig(base_urls=replicas, weights_dir=str(weights))
        return VLLMServerPolicy(config, model=model, tokenizer=tokenizer)

    with ThreadPoolExecutor(2) as pool:
        zero = pool.submit(rank, 0)
        time.sleep(0.5)
        one = pool.submit(rank, 1)
        rank_0, rank_1 = zero.result(), one.result()
    try:
        rank_0._down[replicas[1]] = time.monotonic()  # only rank 0 saw it fail
        _perturb(model, seed=1)
        current = continuation_logprobs(model, prompt)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda policy: policy.sync_weights(model), (rank_0, rank_1)))
        skipped = rank_0.served_logprobs(replicas[1], prompt)
        assert skipped != pytest.approx(current, abs=1e-3)  # rank 0 did not reload it
        assert replicas[1] in rank_1._down  # the other rank knows
        rank_1._sessions["episode"] = replicas[1]
        assert _turn(rank_1, prompt, "episode").text in ACTIONS
        served = rank_1.served_logprobs(replicas[1], prompt)  # reloaded before it sampled
        assert served == pytest.approx(current, abs=1e-3)
    finally:
        rank_0.close()
        rank_1.close()


def test_a_replica_down_when_the_policy_is_built_is_used_once_it_answers(replicas, vllm_model_dir):
    model, tokenizer, prompt = _learner(vllm_model_dir)
    with socket.socket() as probe:  # nothing listens here until the proxy starts
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    late = f"http://127.0.0.1:{port}"
    config = VLLMServerPolicyConfig(base_urls=[late, replicas[0]])
    policy = VLLMServerPolicy(config, model=model, tokenizer=tokenizer)  # was a ConfigError
    proxy = None
    try:
        assert late in policy._down
        _perturb(model, seed=2)
        policy.sync_weights(model)
        current = continuation_logprobs(model, prompt)
        assert _turn(policy, prompt, "early").text in ACTIONS
        assert policy._sessions["early"] == replicas[0]
        proxy = FailingProxy(replicas[1], port=port)  # the late replica answers now
        time.sleep(1.1)  # a down replica is asked again at most once a second
        policy._sessions["late"] = late
        assert _turn(policy, prompt, "late").text in ACTIONS
        assert policy._sessions["late"] == late  # used, not failed over
        assert policy.served_logprobs(late, prompt) == pytest.approx(current, abs=1e-3)
    finally:
        policy.close()
        if proxy is not None:
            proxy.close()
    with pytest.raises(ConfigError, match="no replica answers"):
        VLLMServerPolicy(VLLMServerPolicyConfig(base_urls=[late]), model=model, tokenizer=tokenizer)
