"""Options of the `openai` policy (the `policy:` block of a config)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class OpenAIPolicyConfig(BaseModel):
    """An OpenAI-compatible chat endpoint: a commercial API, vLLM's server, a served checkpoint."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(
        description="Endpoint root up to and including `/v1`, e.g. `http://127.0.0.1:8000/v1` "
        "or `https://api.openai.com/v1`; requests go to `<base_url>/chat/completions`."
    )
    model: str = Field(min_length=1, description="Model name sent with every request.")
    api_key_env: str | None = Field(
        None,
        min_length=1,
        description="Name of the environment variable that holds the API key (sent as "
        "`Authorization: Bearer <key>`); the key itself never goes in a config. "
        "null: no key (a local server).",
    )
    max_concurrency: int = Field(8, gt=0, description="Most requests in flight at once.")
    max_retries: int = Field(
        5,
        ge=0,
        description="Retries of a request that got 408, 429 or a 5xx, timed out or lost its "
        "connection; other errors fail at once.",
    )
    backoff_s: float = Field(
        1.0,
        gt=0,
        description="Delay before the first retry; it doubles each retry, with jitter, up to "
        "`backoff_max_s`. A `Retry-After` header from the server takes precedence.",
    )
    backoff_max_s: float = Field(30.0, gt=0, description="Longest delay between two retries.")
    timeout_s: float = Field(60.0, gt=0, description="Seconds one request may take.")
    max_tokens: int | None = Field(
        None,
        gt=0,
        description="Most tokens per answer; null: `rollout.max_new_tokens` (small models' "
        "budget; API models that think aloud need more).",
    )
    temperature: float | None = Field(
        None,
        ge=0,
        description="Sampling temperature sent; null: the evaluation's (`eval.temperature`, "
        "0 when `eval.greedy`).",
    )
    send_seed: bool = Field(
        True,
        description="Send each turn's seed (`seed`), so servers that honour it sample "
        "reproducibly; turn off for APIs that reject the field.",
    )
    system_prompt: str | None = Field(
        None, description="A system message put before the conversation; null: none."
    )
    allowed_actions: Literal["prompt", "structured_outputs"] = Field(
        "prompt",
        description="How the env's valid actions reach the model. `prompt`: only as the env "
        "writes them in its observations (any API). `structured_outputs`: also as "
        "`structured_outputs: {choice: [...]}`, which vLLM's server enforces while decoding.",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra JSON fields merged into every request (server-specific options, "
        "e.g. `top_p`); they override the fields set from the options above.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https:// (got {url!r})")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _backoff_order(self) -> OpenAIPolicyConfig:
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s}) is below backoff_s ({self.backoff_s})"
            )
        return self
