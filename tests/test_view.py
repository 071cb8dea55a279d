"""`agentgym view`: a real short run, the viewer on a loopback port, driven in headless Chromium."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

LEVELS = ["GoToObj", "GoToLocal"]


def agentgym(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentgym_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny model, evaluated, trained 2 updates (horizon 2 then 3), evaluated again."""
    base = tmp_path_factory.mktemp("view")
    model = base / "model"
    result = agentgym(
        "model", "init", "--env", "babyai", "--env-option", f"levels=[{','.join(LEVELS)}]",
        "--size", "hidden_size=32", "--size", "vocab_size=512", "--tasks", "30",
        "--out", str(model),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    raw = {
        "run": {"name": "viewrun", "output_dir": str(base / "run")},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": LEVELS, "list_actions": False},
        "algorithm": {"name": "grpo"},
        "scheduler": {
            "name": "scaling_inter",
            "stages": [{"until_step": 1, "max_turns": 2}, {"until_step": 2, "max_turns": 3}],
        },
        "rollout": {"max_context_tokens": 512},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2},
        "eval": {"split": "test", "num_tasks": 4, "k": 2},
        "tracking": {"log_trajectories": 100, "frames": 100},
        "stages": [
            {"name": "before", "type": "eval"},
            {"name": "train", "type": "train"},
            {"name": "after", "type": "eval"},
        ],
    }
    config = base / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = agentgym("train", str(config), "--no-progress", "--quiet")
    assert result.returncode == 0, result.stderr
    return base / "run"


@pytest.fixture(scope="module")
def viewer(run_dir, tmp_path_factory):
    from agentgym_core.serve.runner import ServerThread
    from agentgym_core.view.app import create_app

    app = create_app(run_dir, cache_dir=tmp_path_factory.mktemp("view-cache"))
    with ServerThread(app) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("no chromium/chromedriver (scripts/ensure_chromium.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(argument)
    options.add_argument("--disable-dev-shm-usage")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


def shot(driver, path: Path, *texts: str) -> None:
    """Save a screenshot; it must not be blank and the page must show `texts`."""
    from PIL import Image
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def shown(d) -> bool:
        return all(t in d.find_element("tag name", "body").text for t in texts)

    # a click's navigation may still be on its way; if the texts never come, the
    # assertion below names what is missing
    wait = WebDriverWait(driver, 10, ignored_exceptions=[StaleElementReferenceException])
    with contextlib.suppress(TimeoutException):
        wait.until(shown)
    driver.save_screenshot(str(path))
    with Image.open(path) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 20, f"{path.name} looks blank"
    body = driver.find_element("tag name", "body").text
    for text in texts:
        assert text in body, f"{text!r} not on {driver.current_url}"


def test_stages_episodes_and_refusals_over_http(viewer, run_dir):
    index = viewer.server.config.app.state.index
    assert [s.name for s in index.stages] == ["before", "train", "after"]
    assert [s.kind for s in index.stages] == ["eval", "train", "eval"]
    counts = index.counts_by_stage()
    assert counts["before"] == counts["after"] == 8 and counts["train"] == 8
    page = httpx.get(viewer.url + "/").text
    assert "h=3" in page  # the ScalingInter boundary on the curves
    assert "agentgym ui " in page and "agentgym view " in page
    assert 'src="http' not in page and 'href="http' not in page  # nothing from outside
    failed = httpx.get(viewer.url + "/episodes", params={"success": 0, "stage": "after"}).text
    assert ">yes<" not in failed and "episodes match" in failed
    for outside in ("/raw/..%2F..%2F..%2Fetc%2Fpasswd", "/raw/%2Fetc%2Fpasswd"):
        assert httpx.get(viewer.url + outside).status_code == 403
    assert httpx.get(viewer.url + "/raw/train/config.yaml").status_code == 200
    assert httpx.get(viewer.url + "/episode/999999").status_code == 404
    assert httpx.post(viewer.url + "/episodes").status_code == 405  # read-only
    from mlflow import MlflowClient

    from agentgym_core.tracking.mlflow_tracker import sqlite_uri

    client = MlflowClient(sqlite_uri(run_dir / "mlflow.db"))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    notes = {r.data.tags.get("mlflow.note.content", "") for r in runs}  # MLflow's UI links here
    assert len(runs) == 3 and {n.rsplit("`agentgym view ", 1)[-1] for n in notes} == {f"{run_dir}`"}


def test_browse_a_run_in_chromium(viewer, browser, tmp_path):
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser.get(viewer.url + "/")
    shot(browser, tmp_path / "overview.png", "viewrun", "GoToObj", "Training: train", "Evaluations")
    browser.find_element("link text", "episodes").click()
    Select(browser.find_element("id", "success")).select_by_visible_text("failed")
    browser.find_element("name", "min_turns").send_keys("2")
    browser.find_element("id", "apply").click()
    # the form's navigation ends after click() returns: wait for it, not read the old URL
    WebDriverWait(browser, 10).until(lambda driver: "success=0" in driver.current_url)
    shot(browser, tmp_path / "failures.png", "episodes match", "no")
    outcomes = [
        td.text for td in browser.find_elements("css selector", "table.episodes td:nth-child(7)")
    ]
    assert outcomes and set(outcomes) == {"no"}
    browser.find_element("css selector", "table.episodes td a").click()
    shot(browser, tmp_path / "episode.png", "turn 1 of", "action:", "start (after reset)")
    probability = browser.find_element("css selector", ".stepper .prob").text
    chosen = browser.find_element("css selector", ".stepper .action strong").text
    shown = re.fullmatch(r"· probability ([0-9.]+) of (\d+) allowed actions", probability)
    assert shown and 0 < float(shown[1]) <= 1, probability
    browser.find_element("css selector", ".stepper details.allowed summary").click()
    allowed = [li.text for li in browser.find_elements("css selector", "details.allowed li")]
    assert len(allowed) == int(shown[2]) and chosen in allowed
    assert browser.find_element("css selector", "details.allowed li.chosen").text == chosen
    frame = browser.find_element("css selector", ".stepper img.frame")
    assert browser.execute_script("return arguments[0].naturalWidth", frame) == 128  # 8x8 tiles
    assert len(_colours(frame.get_attribute("src"))) > 3  # minigrid's grid, walls, agent, object
    find = browser.find_elements
    frames = [f.get_attribute("src") for f in find("css selector", "ol img.frame")]
    actions = [a.text.removeprefix("> ") for a in find("css selector", "ol .action")]
    assert len(frames) == len(actions) + 1 >= 3  # the start, then one after every turn
    task = int(re.search(r"task (\d+)", browser.find_element("tag name", "h1").text)[1])
    assert frames == _replayed_frames(task, actions)  # minigrid's own drawing, turn by turn
    browser.find_element("id", "next").click()
    shot(browser, tmp_path / "turn2.png", "turn 2 of", "Your goal")
    browser.find_element("id", "prev").click()
    assert "turn 1 of" in browser.find_element("class name", "position").text
    browser.get(viewer.url + "/compare")
    browser.find_element("class name", "open-task").click()
    shot(browser, tmp_path / "compare.png", "Compare before and after", "before", "after", "turn 1")
    assert len(browser.find_elements("css selector", ".sides .side")) == 2


def _replayed_frames(task: int, actions: list[str]) -> list[str]:
    """The frames the env draws for `task` when those actions are played again."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.rollout.frames import encode_frame

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS, list_actions=False))
    env.reset(task)
    frames = [encode_frame(env.render())]
    for action in actions:
        env.step(action)
        frames.append(encode_frame(env.render()))
    env.close()
    return frames


def _colours(data_uri: str) -> set:
    """The distinct pixel colours of a PNG data URI."""
    import base64
    import io

    from PIL import Image

    assert data_uri.startswith("data:image/png;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(data_uri.split(",", 1)[1]))).convert("RGB")
    return {colour for _, colour in image.getcolors(maxcolors=1 << 16)}


def test_live_pages_reload_as_a_training_run_logs(run_dir, browser, tmp_path):
    """An open overview shows a stage that a real training run adds while it is open."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    from agentgym_core.serve.runner import ServerThread
    from agentgym_core.view.app import create_app

    live_run = tmp_path / "run"
    shutil.copytree(run_dir, live_run)
    config = yaml.safe_load((run_dir / "train" / "config.yaml").read_text())
    config["run"]["output_dir"] = str(live_run)
    config["stages"] = [{"name": "more", "type": "train", "trainer": {"steps": 1}}]
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(config))
    with ServerThread(create_app(live_run, cache_dir=tmp_path / "cache")) as server:
        browser.get(server.url + "/")
        assert "Training: more" not in browser.find_element("tag name", "body").text
        browser.execute_script("window.notReloaded = true")
        result = agentgym("train", str(tmp_path / "more.yaml"), "--no-progress", "--quiet")
        assert result.returncode == 0, result.stderr
        # a reload may land between finding an element and using it: the wait tries again
        wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])
        seen = {"body": ""}

        def shows_new_stage(driver) -> bool:
            seen["body"] = driver.find_element("tag name", "body").text
            return "Training: more" in seen["body"]

        with contextlib.suppress(TimeoutException):
            wait.until(shows_new_stage)
        assert "Training: more" in seen["body"], "the open page never showed the new stage"
        assert browser.execute_script("return window.notReloaded") is None  # it reloaded
        # untick: the page stays as it is
        wait.until(lambda d: d.find_element("id", "live").click() or True)
        assert browser.execute_script("return localStorage.getItem('agentgym-view-live')") == "off"
        browser.execute_script("localStorage.removeItem('agentgym-view-live')")


def test_dump_dom_of_the_start_page_lists_episodes_with_levels(viewer, run_dir):
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.skip("no chromium")
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", viewer.url + "/"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = result.stdout
    assert 'class="episodes"' in dom, result.stderr[-2000:]
    levels = {level for level in LEVELS if f'<td class="level">{level}</td>' in dom}
    assert levels == set(LEVELS)
    assert dom.count('href="/episode/') >= 20


def _episode(task: int, level: str, success: bool, turns: int) -> dict:
    return {
        "task_id": task,
        "group": task % 64,
        "turns": [
            {
                "action": f"move forward {i}",
                "observation": f"Your goal: go to the ball {i}",
                "reward": 0.0,
                "done": i == turns - 1,
                "info": {},
            }
            for i in range(turns)
        ],  # fmt: skip
        "reward": 1.0 if success else 0.0,
        "success": success,
        "termination": "done" if success else "horizon",
        "error": None,
        "task_group": level,
    }


def test_a_page_of_100k_episodes_answers_in_under_a_second(tmp_path):
    from fastapi.testclient import TestClient

    from agentgym_core.tracking.mlflow_tracker import MlflowTracker
    from agentgym_core.view.app import create_app

    run = tmp_path / "big"
    MlflowTracker(run, run_name="big/train", traces=False, log_trajectories=0).close()
    levels = ["GoToObj", "GoToLocal", "PickupDist", "OpenDoor"]
    (run / "rollouts").mkdir()
    with (run / "rollouts" / "step-000000.jsonl").open("w") as out:
        for i in range(100_000):
            episode = _episode(i // 4, levels[i % 4], i % 3 == 0, 1 + i % 6)
            out.write(json.dumps(episode) + "\n")
    start = time.perf_counter()
    app = create_app(run, cache_dir=tmp_path / "cache")
    indexed = time.perf_counter() - start
    assert app.state.index.count() == 100_000
    client = TestClient(app)
    for url in (
        "/",
        "/episodes?success=0&level=OpenDoor&sort=reward&desc=1&page=40",
        "/episodes?min_turns=3&max_turns=4&sort=turns&page=700",
        "/episode/99999?turn=2",
    ):
        start = time.perf_counter()
        response = client.get(url)
        seconds = time.perf_counter() - start
        assert response.status_code == 200 and seconds < 1.0, (url, seconds)
    assert "1 episodes match" not in client.get("/episodes?level=OpenDoor").text
    start = time.perf_counter()
    again = create_app(run, cache_dir=tmp_path / "cache")  # the cached index: no file read
    reopened = time.perf_counter() - start
    assert again.state.index.count() == 100_000 and reopened < 1.0
    print(f"100k episodes: indexed in {indexed:.1f} s, reopened in {reopened:.2f} s")


def test_view_is_a_subcommand():
    from agentgym_core.cli import build_parser

    args = build_parser().parse_args(["view", "runs/x", "--port", "9000"])
    assert args.run_dir == "runs/x" and args.port == 9000 and args.func.__name__ == "cmd_view"


def _partial_run(root: Path) -> Path:
    """A hand-made run: one eval stage that lost 3 of 8 episodes to env errors, one traced."""
    from agentgym_core.tracking.mlflow_tracker import MlflowTracker
    from agentgym_core.types import Termination, Trajectory, Turn

    run = root / "partial"
    tracker = MlflowTracker(run, run_name="partial/exam", traces=False, log_trajectories=100)
    metrics = {"success_rate": 0.8, "mean_reward": 0.8, "avg@k": 0.75, "pass@k": 1.0, "k": 2.0}
    metrics.update(episodes=5.0, env_errors=3.0, partial=1.0)
    metrics.update({"group/GoToObj/success_rate": 0.75, "group/GoToObj/episodes": 4.0})
    metrics.update({"group/GoToObj/env_errors": 0.0, "group/GoToLocal/success_rate": 1.0})
    metrics.update({"group/GoToLocal/episodes": 1.0, "group/GoToLocal/env_errors": 3.0})
    tracker.agentgym_after_evaluation(step=0, split="test", metrics=metrics)
    trace = (
        '  File "agentgym_env_remote/client.py", line 262, in _send\n'
        "    response = self._client.request(method, url, json=payload)\n"
        "RemoteEnvError: POST /step: server unreachable (ConnectError: refused)"
    )
    episodes = [
        Trajectory(task_id=1, group=1, task_group="GoToObj", success=True, reward=1.0,
                   turns=[Turn("go forward", "You reached it.", 1.0, True)]),
        Trajectory(task_id=2, group=2, task_group="GoToLocal", turns=[],
                   termination=Termination.ENV_ERROR, error=trace.splitlines()[-1],
                   error_trace=trace),
    ]  # fmt: skip
    tracker.log_episodes(0, episodes, split="test")
    tracker.close()
    return run


def test_a_partial_evaluation_and_an_env_error_in_chromium(browser, tmp_path):
    from agentgym_core.serve.runner import ServerThread
    from agentgym_core.view.app import create_app

    run = _partial_run(tmp_path)
    with ServerThread(create_app(run, cache_dir=tmp_path / "cache")) as server:
        browser.get(server.url + "/")
        shot(browser, tmp_path / "partial.png", "Evaluations", "PARTIAL EVALUATION")
        row = browser.find_element("css selector", "tr.partial").text
        assert "0.8 PARTIAL" in row and "5 of 8" in row
        note = browser.find_element("class name", "partial-note").text
        assert "3 of 8 episodes ended in env_error" in note and "only the 5 measured" in note
        marks = browser.find_elements("css selector", "tr.partial td .partial-mark")
        assert len(marks) == 2  # the overall rate and GoToLocal's, not GoToObj's
        browser.find_element("link text", "The env_error episodes").click()
        shot(browser, tmp_path / "failed.png", "env_error")
        browser.find_element("css selector", "table.episodes td a").click()
        shot(browser, tmp_path / "error.png", "The environment failed", "in _send")
        message = browser.find_element("class name", "error-message").text
        assert message == "RemoteEnvError: POST /step: server unreachable (ConnectError: refused)"
        shown = browser.find_element("css selector", "pre.trace").text
        assert shown.splitlines()[0].strip().startswith('File "agentgym_env_remote/client.py"')
        assert shown.splitlines()[-1] == message
