"""Checkpoints: Hugging Face weights plus everything needed to continue exactly.

A checkpoint folder `step-000120/` holds the model and tokenizer as
`save_pretrained` writes them (any tool can load it) and `trainer_state.pt`
with the step, optimizer state, RNG states and the metrics history. It is
written to a temporary folder and renamed, so a crash never leaves half a
checkpoint behind.

Under `accelerate launch` every rank calls `save_learner_checkpoint` (gathering
state can be a collective), only the main process writes, and every rank
resumes from the same folder (on several nodes, `run.output_dir` must be on a
shared file system).
"""

from __future__ import annotations

import random
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentgym_core import distributed

if TYPE_CHECKING:
    from agentgym_core.learner.learner import Learner

STATE_FILE = "trainer_state.pt"


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    """Folder of the checkpoint taken after `step` updates."""
    return output_dir / "checkpoints" / f"step-{step:06d}"


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint under `output_dir`, if any."""
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return None
    done = _complete(root)
    return done[-1] if done else None


def save_checkpoint(
    output_dir: Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer_state: dict[str, Any],
    history: list[dict[str, float]],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically and return its folder."""
    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with warnings.catch_warnings():
        # PEFT looks for the base's config.json to see if its vocabulary changed; a LoRA
        # stage's base may itself be an adapter checkpoint, which has none (nor a new vocab)
        warnings.filterwarnings("ignore", message="Could not find a config file")
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "optimizer": optimizer_state,
        "history": history,
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
        "extra": extra or {},
    }
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def save_learner_checkpoint(
    output_dir: Path,
    step: int,
    learner: Learner,
    *,
    tokenizer: Any,
    history: list[dict[str, float]],
    keep: int | None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Checkpoint a learner after `step` updates, keeping the newest `keep`; returns the folder.

    `extra` joins the state's `extra` (e.g. rollouts in flight, from
    `sources.AheadRollouts.checkpoint_state`).

    Call it on every rank: with several, it first checks that all ranks hold the
    same weights (their fingerprints go into the state as `extra["ranks"]`).
    """
    optimizer_state = learner.optimizer_state()  # gathered from its shards under FSDP
    extra = {**(extra or {}), "learner": learner.state()}
    if distributed.world_size() > 1:
        extra["ranks"] = distributed.same_weights(learner.unwrapped, step=step)
    if distributed.is_main():
        save_checkpoint(
            output_dir,
            step,
            model=learner.unwrapped,
            tokenizer=tokenizer,
            optimizer_state=optimizer_state,
            history=history,
            extra=extra,
        )
        prune_checkpoints(output_dir, keep)
    distributed.wait()  # no rank reads or moves on before the folder is complete
    return checkpoint_dir(output_dir, step)


def restore_learner(
    learner: Learner, resume: Path | None
) -> tuple[list[dict[str, float]], int, dict[str, Any]]:
    """Continue from checkpoint `resume` (None: a fresh start): history, first step, extra state.

    Restores the learner's optimizer, shuffle and lr schedule, and the global RNGs.
    Call it after the learner is built, so that building one does not move the
    restored RNGs.
    """
    if resume is None:
        return [], 0, {}
    state = load_trainer_state(resume)
    learner.load_optimizer_state(state["optimizer"])
    learner.load_state(state["extra"]["learner"])
    return list(state["history"]), state["step"], state["extra"]


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """Read `trainer_state.pt` and restore the global RNG states it holds."""
    state = torch.load(checkpoint / STATE_FILE, weights_only=False)
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    cuda = state["rng"].get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)  # a different GPU count cannot resume bit-exactly anyway
    return state


def prune_checkpoints(output_dir: Path, keep: int | None) -> None:
    """Delete all but the newest `keep` complete checkpoints (None keeps all)."""
    if keep is None:
        return
    done = _complete(output_dir / "checkpoints")
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _complete(root: Path) -> list[Path]:
    """Finished checkpoint folders, oldest first (never a `.tmp` left by a crash)."""
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if re.fullmatch(r"step-\d{6}", p.name) and (p / STATE_FILE).is_file()
    )
