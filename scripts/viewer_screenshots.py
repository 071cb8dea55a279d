"""The viewer's screenshots in docs/: a short real BabyAI run with frames, shown in Chromium.

    .venv/bin/python scripts/viewer_screenshots.py   # docs/viewer.png, docs/viewer-episode.png

A fresh tiny model, evaluated, trained 6 GRPO updates (ScalingInter 3 -> 6 turns) with
`tracking.frames`, evaluated again; then `agentgym view` of that run in headless
Chromium (scripts/ensure_chromium.sh installs it): the overview, and the first failed
episode of the last evaluation on its second turn.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ["GoToObj", "GoToLocal", "PickupDist"]


def agentgym(*args: str) -> None:
    """Run the agentgym CLI (quietly), failing loudly."""
    command = [sys.executable, "-m", "agentgym_core.cli", *args]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def make_run(base: Path) -> Path:
    """The run folder of a short real training with frames."""
    model = base / "model"
    agentgym(
        "model", "init", "--env", "babyai", "--env-option", f"levels=[{','.join(LEVELS)}]",
        "--size", "hidden_size=32", "--size", "vocab_size=512", "--tasks", "30",
        "--out", str(model),
    )  # fmt: skip
    raw = {
        "run": {"name": "babyai-viewer", "output_dir": str(base / "run")},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": LEVELS, "list_actions": False},
        "algorithm": {"name": "grpo"},
        "scheduler": {
            "name": "scaling_inter",
            "stages": [{"until_step": 3, "max_turns": 3}, {"until_step": 6, "max_turns": 6}],
        },
        "rollout": {"max_context_tokens": 768},
        "trainer": {"steps": 6, "tasks_per_step": 4, "group_size": 4},
        "eval": {"split": "test", "num_tasks": 12, "k": 2, "max_turns": 6},
        "tracking": {"log_trajectories": 100, "frames": 100},
        "stages": [
            {"name": "before", "type": "eval"},
            {"name": "train", "type": "train"},
            {"name": "after", "type": "eval"},
        ],
    }
    config = base / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    agentgym("train", str(config), "--no-progress", "--quiet")
    return base / "run"


def main() -> None:
    """Make the run, open it in the viewer, save the two screenshots."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from agentgym_core.serve.runner import ServerThread
    from agentgym_core.view.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp))
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for argument in ("--headless=new", "--no-sandbox", "--window-size=1280,900"):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        app = create_app(run, cache_dir=Path(tmp) / "cache")
        try:
            with ServerThread(app) as server:
                driver.get(server.url + "/")
                driver.save_screenshot(str(ROOT / "docs" / "viewer.png"))
                driver.get(server.url + "/episodes?stage=after&success=0&min_turns=3")
                driver.find_element("css selector", "table.episodes td a").click()
                driver.find_element("id", "next").click()
                driver.save_screenshot(str(ROOT / "docs" / "viewer-episode.png"))
        finally:
            driver.quit()
    print("wrote docs/viewer.png and docs/viewer-episode.png")


if __name__ == "__main__":
    main()
