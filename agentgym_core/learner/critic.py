"""The value function of actor-critic algorithms (PPO): a linear head on a last hidden state.

The hidden state is either the policy's own (a value head on the policy: the
head reads the hidden states of the policy's forward pass, so a value costs one
dot product per token) or that of a separate critic model with its own
transformer body, as `CriticSpec.separate` chooses. Either way the critic's
weights and optimizer live in the learner and go into its checkpoint state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from agentgym_core.interfaces import CriticSpec
from agentgym_core.learner.forward import run_model
from agentgym_core.learner.packing import MicroBatch
from agentgym_core.learner.precision import MasterWeights
from agentgym_core.learner.settings import LearnerSettings, adamw, lr_schedule
from agentgym_core.modeling.text_config import text_config


class ValueHead(nn.Module):
    """hidden [rows, width, hidden] -> values [rows, width], in float32.

    Starts at zero: the first advantages are then plain discounted returns
    rather than the noise of a random head, and the gradient still reaches the
    weights (it is the hidden state times the value error).
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values of every position."""
        return self.linear(hidden.float()).squeeze(-1)


def last_hidden_state(body: Any, batch: MicroBatch) -> torch.Tensor:
    """The final (normed) hidden states of a transformer body (a `base_model`) on `batch`."""
    return run_model(body, batch).last_hidden_state


class Critic(nn.Module):
    """A value head, plus its own transformer body when the critic is a separate model."""

    def __init__(self, head: ValueHead, body: nn.Module | None = None) -> None:
        super().__init__()
        self.head = head
        self.body = body

    @property
    def shared(self) -> bool:
        """True when the head reads the policy's hidden states."""
        return self.body is None

    def forward(self, batch: MicroBatch, policy_hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Values [rows, width]: position c holds V(state before token c + 1)."""
        if self.body is not None:
            return self.head(last_hidden_state(self.body, batch))
        if policy_hidden is None:
            raise ValueError("a value head on the policy needs the policy's hidden states")
        return self.head(policy_hidden)


def hidden_size(model: Any) -> int:
    """Width of a causal LM's last hidden state (the text part of multimodal configs)."""
    return int(text_config(model).hidden_size)


def build_critic(spec: CriticSpec, policy: Any, load_model: Callable[[str | None], Any]) -> Critic:
    """The critic `spec` asks for; `load_model(path)` loads a causal LM for a separate body.

    A separate critic keeps only the loaded model's transformer body (its
    `base_model`); the LM head is dropped.
    """
    if not spec.separate:
        return Critic(ValueHead(hidden_size(policy)))
    model = load_model(spec.path)
    return Critic(ValueHead(hidden_size(model)), body=model.base_model)


class CriticTrainer:
    """A critic prepared by accelerate, with its own AdamW and lr schedule, and its saved state.

    Its peak lr is `CriticSpec.lr` (else the policy's); its gradients are clipped
    on their own. During the first `CriticSpec.warmup_updates` updates only the
    critic steps (`Learner.critic_only`).
    """

    def __init__(
        self, spec: CriticSpec, critic: Critic, accelerator: Any, settings: LearnerSettings
    ) -> None:
        self.spec = spec
        self.accelerator = accelerator
        critic = critic.to(accelerator.device)
        self.masters = MasterWeights(critic.parameters())  # a separate body loaded in bf16
        optimized = self.masters.optimized(critic.parameters())
        optimizer = adamw(optimized, spec.lr or settings.lr, settings)
        self.module, self.optimizer = accelerator.prepare(critic, optimizer)
        self.scheduler = lr_schedule(self.optimizer, settings)

    @property
    def bare(self) -> Critic:
        """The critic without its data-parallel wrapper."""
        return self.accelerator.unwrap_model(self.module)

    def step(self, clip: Callable[[Any], float]) -> float:
        """Clip with `clip(parameters)`, step and clear; returns the norm before clipping."""
        self.masters.gradients_to_masters()
        stepped = self.masters.optimized(self.module.parameters())
        norm = clip(stepped if self.masters.pairs else self.module.parameters())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.masters.masters_to_model()
        return norm

    def state(self) -> dict[str, Any]:
        """Weights, optimizer and schedule, for a checkpoint."""
        state = {
            "weights": self.bare.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.masters.pairs:
            state["masters"] = self.masters.state()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        self.bare.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.masters.pairs:
            self.masters.load_state(state.get("masters", []))
