"""A real OpenAI-compatible chat server on 127.0.0.1, serving a tiny local model.

`/v1/chat/completions` renders the messages with the model's chat template
and generates with the core `hf` policy, so a greedy answer is the model's
own greedy answer; `structured_outputs.choice` restricts decoding to those
strings, as vLLM's server does. For the client's error handling the server
can require a key, answer the next requests with given error statuses, hold
each request for a while (to count concurrent ones), and refuse prompts over
a context length with the 400 message OpenAI and vLLM send.
"""

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class ServerState:
    """What the test sets before requests and reads after them."""

    api_key: str | None = None
    faults: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    """(status, headers) answered to the next requests, in order, before any generation."""
    latency_s: float = 0.0
    max_context: int = 100_000
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)

    def reset(self) -> None:
        """Back to a healthy server with no counts."""
        for name, value in vars(ServerState()).items():
            setattr(self, name, value)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def build_app(model: Any, tokenizer: Any, state: ServerState):
    """The FastAPI app of the server."""
    from agentgym_core.interfaces import SamplingParams
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig

    app = FastAPI()
    policy = HFPolicy(HFPolicyConfig(prefix_cache=False), model=model, tokenizer=tokenizer)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        state.requests += 1
        state.authorizations.append(request.headers.get("authorization"))
        if state.api_key is not None and request.headers.get("authorization") != (
            f"Bearer {state.api_key}"
        ):
            return _error(401, "Incorrect API key provided.")
        if state.faults:
            status, headers = state.faults.pop(0)
            return _error(status, f"injected fault {status}", headers)
        body = await request.json()
        state.bodies.append(body)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            await asyncio.sleep(state.latency_s)
            return await _complete(body)
        finally:
            state.in_flight -= 1

    async def _complete(body: dict[str, Any]):
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages: a non-empty list is required")
        ids = tokenizer.apply_chat_template(
            body["messages"], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        max_tokens = int(body.get("max_tokens") or 16)
        state.prompt_tokens.append(len(ids))
        if len(ids) + max_tokens > state.max_context:
            return _error(
                400,
                f"This model's maximum context length is {state.max_context} tokens. However, "
                f"you requested {len(ids) + max_tokens} tokens. Please reduce the length.",
            )
        temperature = float(body.get("temperature", 1.0))
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=temperature or 1.0,
            greedy=temperature == 0.0,
            seed=body.get("seed"),
        )
        choice = (body.get("structured_outputs") or {}).get("choice")
        generation = await policy.generate(list(ids), params, choice)
        return {
            "id": f"chatcmpl-{state.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": generation.text},
                    "finish_reason": "stop" if generation.finished else "length",
                }
            ],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(generation.token_ids),
                "total_tokens": len(ids) + len(generation.token_ids),
            },
        }

    return app


@dataclass
class ChatServer:
    """A running server: its `/v1` URL, its state, and the model folder it serves."""

    base_url: str
    state: ServerState
    model_dir: Any


@pytest.fixture(scope="session")
def chat_server_session(tiny_model_dir):
    """Start uvicorn in a thread on a free 127.0.0.1 port, once per session."""
    import uvicorn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    state = ServerState()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(model, tokenizer, state), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test chat server did not start")
        time.sleep(0.02)
    yield ChatServer(f"http://127.0.0.1:{port}/v1", state, tiny_model_dir)
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def chat_server(chat_server_session):
    """The session's server, healthy and with zeroed counts for this test."""
    chat_server_session.state.reset()
    return chat_server_session
