"""The results harness (`benchmarks/results.py`): math, tables, curves, resume, smoke mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness.readme import write_report  # noqa: E402
from benchmarks.harness.report import (  # noqa: E402
    group_table,
    largest_drop,
    main_table,
    missing_runs,
    moving_average,
    overlapping,
    paired_table,
    plot,
    reruns_line,
    spread,
    summary_table,
)
from benchmarks.harness.runner import (  # noqa: E402
    Paths,
    build_model,
    cost,
    eval_record,
    final_checkpoint,
    group_success,
    pipeline_config,
    reproduction,
    run_arm,
    run_pipeline_once,
    whole_curve,
)
from benchmarks.harness.spec import load_scenario, scenario_names  # noqa: E402

SCENARIO = """
title: Toy
why: Two arms on a toy env.
seeds: [0, 1]
model: {}
corpus: {}
config: {env: {name: toy}}
evals:
  test: {split: test, max_turns: 4}
arms:
  short:
    label: fixed 2
    overrides: {scheduler: {name: fixed, max_turns: 2}}
  si:
    label: ScalingInter
    overrides:
      scheduler:
        name: scaling_inter
        stages: [{until_step: 2, max_turns: 2}, {until_step: 4, max_turns: 4}]
compare: {si: [short]}
paper:
  columns: [toy]
  rows: [{name: big model, values: [50.0]}]
  note: Not the same tasks.
"""


@pytest.fixture
def scenario(tmp_path):
    (tmp_path / "toy.yaml").write_text(SCENARIO)
    return load_scenario("toy", tmp_path)


def _result(arm, seed, test, groups, curve=(), seconds=0.0):
    points = [
        {"step": i, "success": s, "turns": 2.0, "episodes": 4.0, "env_errors": 1.0, "tokens": 10.0}
        for i, s in enumerate(curve)
    ]
    return {
        "scenario": "toy",
        "arm": arm,
        "seed": seed,
        "curve": points,
        "evals": {
            "test": {
                "success_rate": test,
                "groups": {g: {"success_rate": v} for g, v in groups.items()},
            }
        },
        "cost": cost(points, seconds),
    }


def test_moving_average_and_largest_drop_by_hand():
    assert moving_average([1.0, 0.0, 0.5, 1.0], window=2) == [1.0, 0.5, 0.25, 0.75]
    assert largest_drop([0.2, 0.6, 0.3, 0.5, 0.1, 0.9]) == pytest.approx(0.5)  # 0.6 -> 0.1
    assert largest_drop([0.1, 0.2, 0.3]) == 0.0


def test_spread_is_mean_95_interval_and_min_max():
    # sd 0.1 over 3 seeds: t(2) 4.303 * 0.1 / sqrt(3) = 0.248
    assert spread([0.5, 0.7, 0.6]) == "0.600 ± 0.248 (0.500-0.700)"
    assert spread([0.25]) == "0.250"
    assert spread([]) == "-"


def test_paired_differences_by_seed_with_their_interval(scenario):
    results = [
        _result("short", 0, 0.50, {}),
        _result("short", 1, 0.60, {}),
        _result("short", 2, 0.40, {}),
        _result("si", 0, 0.60, {}),
        _result("si", 1, 0.65, {}),
        _result("si", 2, 0.55, {}),
        _result("si", 3, 0.90, {}),  # no `short` run at seed 3: left out of the pairs
    ]
    # differences 0.10, 0.05, 0.15: mean 0.10, sd 0.05, t(2) 4.303 * 0.05 / sqrt(3) = 0.124
    table = paired_table(scenario, results).splitlines()
    assert table[0] == "| difference (same seed, same start) | test | seeds |"
    assert table[2] == "| ScalingInter - fixed 2 | +0.100 ± 0.124: no difference shown | 0, 1, 2 |"
    # unpaired arms: the arms' own intervals overlap, yet every seed gains 0.10 +- 0.01
    steady = [_result("short", s, 0.5 + 0.1 * s, {}) for s in range(3)]
    steady += [_result("si", s, 0.6 + 0.1 * s + 0.01 * (s == 1), {}) for s in range(3)]
    row = paired_table(scenario, steady).splitlines()[2]
    assert row == "| ScalingInter - fixed 2 | +0.103 ± 0.014: shown | 0, 1, 2 |"
    assert paired_table(scenario, [_result("si", 0, 0.6, {})]) == ""


def test_cost_counts_env_steps_of_scored_episodes_and_tokens():
    points = [{"turns": 3.0, "episodes": 8.0, "env_errors": 2.0, "tokens": 100.0}] * 2
    assert cost(points, 12.34) == {
        "train_seconds": 12.3,
        "updates": 2,
        "env_steps": 36,
        "sampled_tokens": 200,
    }


def test_cost_adds_the_env_steps_that_made_sft_data():
    sft = [{"expert_env_steps": 40.0}, {}, {"expert_env_steps": 40.0}, {}]  # resumed once
    rl = [{"turns": 2.0, "episodes": 4.0, "env_errors": 0.0, "tokens": 10.0}]
    assert cost(sft + rl, 1.0)["env_steps"] == 40 + 40 + 8


def test_cost_adds_what_an_evolve_stage_explored():
    points = [{"turns": 3.0, "episodes": 8.0, "env_errors": 0.0, "tokens": 100.0}]
    explored = [{"evolve/env_steps": 50.0, "evolve/sampled_tokens": 400.0}] * 2
    assert cost(points, 1.0, explored) == {
        "train_seconds": 1.0,
        "updates": 1,
        "env_steps": 124,
        "sampled_tokens": 900,
    }


def test_an_evolve_arm_runs_agentevol_rounds_and_keeps_its_explorations(tmp_path):
    """`--smoke` of TextCraft's AgentEvol arm: a real `type: evolve` stage with one round."""
    command = [sys.executable, "benchmarks/results.py", "--scenario", "textcraft", "--smoke"]
    command += ["--arms", "evolve"]
    for name in ("data", "work", "out"):
        command += [f"--{name}", str(tmp_path / name)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "data" / "textcraft" / "evolve-seed0.json").read_text())
    assert result["config"]["stages"][0] == {"name": "train", "type": "evolve"}
    [explored] = result["explorations"]  # smoke: one round after cloning, on 4 tasks
    assert explored["evolve/episodes"] == 4.0
    # each round's fine-tune made the expert data again: its env steps count too
    expert = [p["expert_env_steps"] for p in result["curve"] if "expert_env_steps" in p]
    assert len(expert) == 2 and expert[0] == expert[1] > 0
    assert result["cost"]["env_steps"] == round(explored["evolve/env_steps"] + sum(expert))
    assert explored["evolve/env_steps"] > 0
    assert result["evals"]["test"]["episodes"] == 4.0
    rounds = tmp_path / "work" / "textcraft" / "seed0" / "evolve" / "train"
    assert sorted(p.name for p in rounds.iterdir() if p.is_dir()) == ["round-0", "round-1"]


def test_training_success_is_kept_per_task_group():
    metrics = {
        "rollout/success_rate": 0.5,
        "rollout/group/click-link/success_rate": 1.0,
        "rollout/group/enter-text/success_rate": 0.25,
        "rollout/group/enter-text/episodes": 4.0,
    }
    assert group_success(metrics) == {"success/click-link": 1.0, "success/enter-text": 0.25}


def test_eval_record_keeps_overall_and_per_group():
    metrics = {"success_rate": 0.5, "mean_reward": 0.4, "avg@k": 0.5, "group/a/success_rate": 1.0}
    metrics["group/a/pass@k"] = 1.0
    assert eval_record(metrics) == {
        "success_rate": 0.5,
        "mean_reward": 0.4,
        "groups": {"a": {"success_rate": 1.0}},
    }


def test_tables_show_mean_range_cost_and_drop(scenario):
    results = [
        _result("untrained", 0, 0.2, {"a": 0.1}),
        _result("untrained", 1, 0.4, {"a": 0.3}),
        _result("short", 0, 0.5, {"a": 0.6}, curve=[0.0, 1.0, 0.0], seconds=10.0),
        _result("short", 1, 0.7, {"a": 0.8}, curve=[0.5, 0.5, 0.5], seconds=20.0),
    ]
    table = main_table(scenario, results).splitlines()
    assert table[0].startswith("| arm | test success | seeds | train s | env steps |")
    assert table[2] == "| untrained | 0.300 ± 1.271 (0.200-0.400) | 0, 1 | - | - | - | - |"
    # MA10 of [0, 1, 0] is [0, 0.5, 0.333]: drop 0.167; a flat curve never drops
    fixed = "| fixed 2 | 0.600 ± 1.271 (0.500-0.700) | 0, 1 | 15 | 18 | 30 | 0.17 / 0.00 |"
    assert table[3] == fixed
    assert len(table) == 4  # the ScalingInter arm has no result: no row
    groups = group_table(scenario, results, "test").splitlines()
    assert groups[0] == "| group | untrained | fixed 2 |"
    assert groups[2] == "| a | 0.20 | 0.70 |"
    assert missing_runs(scenario, results) == ["si seed 0", "si seed 1"]


def test_runs_that_shared_the_machine_are_found_and_their_time_starred(scenario):
    def run(arm, seed, started, wall, scenario="toy"):
        result = _result(arm, seed, 0.5, {}, curve=[0.5], seconds=wall)
        return result | {"scenario": scenario, "started": started, "wall_seconds": wall}

    sweep = [  # one after the other, the next starting within the second the last ended
        run("short", 0, "2026-01-01T00:00:00+00:00", 100.4),
        run("si", 0, "2026-01-01T00:01:40+00:00", 200.0),
    ]
    assert overlapping(sweep) == set()
    beside = run("short", 1, "2026-01-01T00:02:00+00:00", 300.0, scenario="other")
    assert overlapping([*sweep, beside]) == {("toy", "si", 0), ("other", "short", 1)}
    table = main_table(scenario, sweep, overlapping([*sweep, beside])).splitlines()
    assert table[2].split(" | ")[3] == "100" and table[3].split(" | ")[3] == "200 *"
    assert table[-1].startswith("\\* Some of these runs overlapped another kept run")
    assert "*" not in main_table(scenario, sweep)
    marked = run("short", 2, "2026-01-02T00:00:00+00:00", 50.0)
    marked["machine"] = {"shared": "our tests, at the lowest priority"}
    assert overlapping([*sweep, marked]) == {("toy", "short", 2)}


def test_summary_has_a_row_per_compared_pair_with_steps_and_drops(scenario):
    results = [
        _result("short", 0, 0.5, {}, curve=[0.0, 1.0, 0.0]),
        _result("short", 1, 0.7, {}, curve=[0.5, 0.5, 0.5]),
        _result("si", 0, 0.6, {}, curve=[0.5] * 6),
        _result("si", 1, 0.9, {}, curve=[0.5] * 6),
    ]
    table = summary_table([(scenario, results)]).splitlines()
    assert table[0].startswith("| scenario | first arm - second arm | paired difference |")
    # differences +0.1 and +0.2: mean 0.15, sd 0.0707, t(1) 12.706 -> half-width 0.635;
    # env steps 4 per update: 6 updates against 3 is 2x; drops (0.167 + 0) / 2 against 0,
    # paired 0 - 0.167 and 0 - 0: mean -0.083, sd 0.118, half-width 12.706 * 0.083 = 1.059
    row = "| toy | ScalingInter - fixed 2 | test: +0.150 ± 0.635: 2 seeds, no verdict | 2.00x "
    assert table[2] == row + "| 0.00 / 0.08; -0.083 ± 1.059: 2 seeds, no verdict | 0, 1 |"
    assert summary_table([(scenario, results[:2])]) == ""  # no pair ran: no table
    scenario.arms["short"].overrides = {}  # an arm without a fixed horizon (SFT, say)
    assert summary_table([(scenario, results)]) == ""  # RL against it is no horizon comparison


def test_drops_pair_seed_by_seed_when_a_run_has_no_rl_updates():
    from benchmarks.harness.report import _paired_drops

    rises_and_falls, flat = [0.0, 1.0, 0.0], [0.5] * 3  # MA10 drops 0.167 and 0
    first = [_result("si", 0, 0.5, {}, curve=rises_and_falls), _result("si", 1, 0.5, {})]
    first.append(_result("si", 2, 0.5, {}, curve=flat))
    second = [
        _result("short", s, 0.5, {}, curve=c) for s, c in enumerate([flat, flat, rises_and_falls])
    ]
    # seed 1's first run has no RL curve: it is left out, and seed 2 still meets seed 2
    assert _paired_drops(first, second) == pytest.approx([0.5 / 3, -0.5 / 3])


def test_plot_draws_curves_with_stage_lines(scenario, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    results = [
        _result("untrained", 0, 0.2, {}),
        _result("si", 0, 0.6, {}, curve=[0.1, 0.3, 0.5, 0.7]),
        _result("si", 1, 0.5, {}, curve=[0.2, 0.2, 0.4, 0.6]),
    ]
    assert scenario.arms["si"].stage_boundaries == [2]
    path = plot(scenario, results, tmp_path / "toy.png")
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[1] > 1000 and pixels.std() > 0.05  # drawn, not blank


def test_report_has_command_tables_paper_missing_runs_and_notes(scenario, tmp_path):
    pytest.importorskip("matplotlib")
    data = tmp_path / "data" / "toy"
    data.mkdir(parents=True)
    (data / "untrained-seed0.json").write_text(json.dumps(_result("untrained", 0, 0.2, {})))
    (tmp_path / "out" / "notes").mkdir(parents=True)
    (tmp_path / "out" / "notes" / "toy.md").write_text("Reading: nothing learned yet.")
    readme = write_report([scenario], tmp_path / "data", tmp_path / "out").read_text()
    assert "`python benchmarks/results.py --scenario toy --seeds 0 1`" in readme
    assert "| big model | 50.0 |" in readme and "Not the same tasks." in readme
    assert "Not run yet (5): untrained seed 1, short seed 0" in readme
    assert readme.rstrip().endswith("Reading: nothing learned yet.")
    assert (tmp_path / "out" / "toy.png").exists()


def test_the_summary_reading_follows_the_summary_table(scenario, tmp_path):
    pytest.importorskip("matplotlib")
    data = tmp_path / "data" / "toy"
    data.mkdir(parents=True)
    for arm, seed, score in [("short", 0, 0.5), ("short", 1, 0.7), ("si", 0, 0.6), ("si", 1, 0.9)]:
        result = _result(arm, seed, score, {}, curve=[0.5] * (6 if arm == "si" else 3))
        (data / f"{arm}-seed{seed}.json").write_text(json.dumps(result))
    notes = tmp_path / "out" / "notes"
    notes.mkdir(parents=True)
    (notes / "summary.md").write_text("Answer: ScalingInter ties fixed 2.")
    readme = write_report([scenario], tmp_path / "data", tmp_path / "out").read_text()
    table = readme.index("| toy | ScalingInter - fixed 2 |")
    assert table < readme.index("Answer: ScalingInter ties fixed 2.") < readme.index("## Toy")


def test_arm_overrides_merge_and_a_renamed_component_replaces_its_block(tmp_path):
    text = SCENARIO.replace(
        "config: {env: {name: toy}}",
        "config: {env: {name: toy}, algorithm: {name: grpo, kl_coef: 0.1}}",
    )
    text = text.replace(
        "  short:\n    label: fixed 2\n    overrides: {scheduler: {name: fixed, max_turns: 2}}",
        "  short:\n    label: fixed 2\n    overrides: {scheduler: {name: fixed, max_turns: 2}, "
        "algorithm: {kl_coef: 0.2}}\n"
        "  sft:\n    overrides: {algorithm: {name: sft, batch_size: 4}}",
    )
    text += "smoke:\n  trainer: {steps: 2}\n  arms:\n    sft: {algorithm: {batch_size: 1}}\n"
    (tmp_path / "toy.yaml").write_text(text)
    scenario = load_scenario("toy", tmp_path)
    assert scenario.arm_config(scenario.arms["short"])["algorithm"] == {
        "name": "grpo",
        "kl_coef": 0.2,
    }
    assert scenario.arm_config(scenario.arms["sft"])["algorithm"] == {
        "name": "sft",
        "batch_size": 4,
    }
    smoke = scenario.arm_config(scenario.arms["sft"], smoke=True)
    assert smoke["algorithm"] == {"name": "sft", "batch_size": 1} and smoke["trainer"] == {
        "steps": 2
    }
    assert scenario.arm_config(scenario.arms["short"], smoke=True)["algorithm"]["kl_coef"] == 0.2


def test_unknown_scenario_and_arm_keys_are_named(tmp_path):
    (tmp_path / "toy.yaml").write_text(SCENARIO)
    with pytest.raises(SystemExit, match="unknown scenario 'nope'; scenarios: toy"):
        load_scenario("nope", tmp_path)
    (tmp_path / "bad.yaml").write_text(SCENARIO.replace("label: fixed 2", "lable: fixed 2"))
    with pytest.raises(SystemExit, match=r"arms.short: unknown keys \['lable'\]"):
        load_scenario("bad", tmp_path)
    (tmp_path / "odd.yaml").write_text(SCENARIO.replace("label: fixed 2", "stage: tune"))
    with pytest.raises(SystemExit, match="arms.short.stage: train or evolve, not 'tune'"):
        load_scenario("odd", tmp_path)
    (tmp_path / "cut.yaml").write_text(SCENARIO.replace("big model,", "big model (7B, chat),"))
    with pytest.raises(SystemExit, match=r"paper.rows.0: keys must be name and values"):
        load_scenario("cut", tmp_path)  # the unquoted comma cut the name short
    (tmp_path / "short.yaml").write_text(SCENARIO.replace("values: [50.0]", "values: []"))
    with pytest.raises(SystemExit, match=r"paper.rows.0: 0 values for 1 columns"):
        load_scenario("short", tmp_path)
    (tmp_path / "start.yaml").write_text(SCENARIO.replace("label: fixed 2", "start: sft"))
    with pytest.raises(SystemExit, match=r"arms.short.start: scratch or an arm that trains "):
        load_scenario("start", tmp_path)
    (tmp_path / "chain.yaml").write_text(SCENARIO.replace("label: fixed 2", "start: si"))
    assert load_scenario("chain", tmp_path).arms["short"].start == "si"
    wide = "label: fixed 2\n    model: {hidden_size: 32"
    (tmp_path / "wide.yaml").write_text(
        SCENARIO.replace("label: fixed 2", wide + "}\n    start: si")
    )
    with pytest.raises(SystemExit, match=r"arms.short.model: only an arm from scratch builds"):
        load_scenario("wide", tmp_path)  # a checkpoint has its own sizes
    (tmp_path / "typo.yaml").write_text(SCENARIO.replace("label: fixed 2", wide + ", hiden: 3}"))
    with pytest.raises(SystemExit, match=r"arms.short.model.hiden: unknown key"):
        load_scenario("typo", tmp_path)


def test_each_evaluation_stage_gets_its_own_settings_not_the_last_ones(scenario, tmp_path):
    """The root `eval` block is the last evaluation's, and stages merge over it: a key only
    the last evaluation sets must not reach the others."""
    evals = {"test": {"split": "test", "k": 4}, "free": {"split": "test", "constrained": False}}
    scenario.evals = evals
    config = pipeline_config(
        scenario, scenario.arms["short"], 0, tmp_path / "m", tmp_path / "run", smoke=False
    )
    test, free = (stage["eval"] for stage in config["stages"][1:])
    assert (test["constrained"], test["k"]) == (None, 4)
    assert (free["constrained"], free["k"]) == (False, 1)


def test_a_bad_evaluation_is_named_with_its_key(tmp_path):
    (tmp_path / "bad.yaml").write_text(SCENARIO.replace("max_turns: 4}", "max_turns: 4, kk: 2}"))
    with pytest.raises(SystemExit, match=r"evals\.test\.kk: unknown key \(did you mean 'k'\?\)"):
        load_scenario("bad", tmp_path)


def test_an_arm_sized_apart_starts_from_its_own_model_with_the_same_tokenizer(tmp_path):
    """`arms.<arm>.model` widens that arm's student only; the tokenizer is the seed's."""
    from agentgym_core.plugins import PluginHost
    from benchmarks.harness.runner import start_model

    wide = "label: fixed 2\n    model: {hidden_size: 48, intermediate_size: 96}"
    text = SCENARIO.replace("label: fixed 2", wide).replace("corpus: {}", "corpus: {tasks: 10}")
    text = text.replace("{name: toy}", "{name: babyai, levels: [GoToObj]}")
    (tmp_path / "toy.yaml").write_text(text)
    toy, host = load_scenario("toy", tmp_path), PluginHost()
    paths = Paths(tmp_path / "data", tmp_path / "work")
    models = {arm: start_model(toy, toy.arms[arm], 0, paths, host, smoke=True) for arm in toy.arms}
    sizes = {
        arm: json.loads((path / "config.json").read_text())["hidden_size"]
        for arm, path in models.items()
    }
    assert sizes == {"untrained": 64, "short": 48, "si": 64}
    assert models["si"] == models["untrained"] != models["short"]
    vocab = {(path / "tokenizer.json").read_text() for path in models.values()}
    assert len(vocab) == 1


def test_shipped_scenarios_load():
    """Every scenario in benchmarks/results/configs passes the loader's checks."""
    for name in scenario_names():
        assert load_scenario(name).arms


def test_whole_curve_keeps_earlier_updates_and_this_process_replays():
    earlier = {0: {"step": 0, "seconds": 2.0}, 1: {"step": 1, "seconds": 3.0}, 2: {"step": 2}}
    replayed = [{"step": 2, "seconds": 1.0}, {"step": 3, "seconds": 1.0}]
    curve, seconds = whole_curve(earlier, replayed)
    assert [p["step"] for p in curve] == [0, 1, 2, 3] and curve[2] is replayed[0]
    assert seconds == 5.0  # the earlier process's updates 0 and 1
    assert whole_curve(earlier, []) == (list(earlier.values()), 5.0)  # finished before: eval only


def test_a_killed_and_resumed_run_keeps_its_whole_curve(tmp_path):
    """A real BabyAI run stopped after update 3 and before its checkpoint, then run again."""
    from agentgym_core.plugins import PluginHost

    babyai = load_scenario("babyai")
    arm, host = babyai.arms["fixed-short"], PluginHost()
    model = build_model(babyai, 0, tmp_path / "model", host, smoke=True)
    run_dir = tmp_path / "run"
    config = pipeline_config(babyai, arm, 0, model, run_dir, smoke=True)
    config["trainer"].update(steps=3, checkpoint_every=2)
    config["stages"] = config["stages"][:1]  # training only
    _, first, _ = run_pipeline_once(config, run_dir, host)
    shutil.rmtree(run_dir / "train" / "checkpoints" / "step-000003")  # killed before it
    _, curve, earlier_seconds = run_pipeline_once(config, run_dir, host)
    assert [p["step"] for p in curve] == [0, 1, 2]
    assert curve[:2] == first[:2] and earlier_seconds == first[0]["seconds"] + first[1]["seconds"]
    replayed = {k: v for k, v in curve[2].items() if k != "seconds"}
    assert replayed == {k: v for k, v in first[2].items() if k != "seconds"}  # resume is exact


def test_kept_result_is_skipped_not_rerun(scenario, tmp_path):
    paths = Paths(tmp_path / "data", tmp_path / "work")
    kept = paths.result("toy", "short", 0)
    kept.parent.mkdir(parents=True)
    record = {"arm": "short", "evals": {"test": {"success_rate": 0.5}}}
    kept.write_text(json.dumps(record))
    # the toy env is not installed: anything but the kept result would fail here
    assert run_arm(scenario, scenario.arms["short"], 0, paths, host=None) == record


def test_a_rerun_says_whether_it_repeated_the_kept_run():
    kept = _result("short", 0, 0.5, {}, curve=[0.1, 0.2])
    same = json.loads(json.dumps(kept))
    assert reproduction(kept, same, "success_rate") == {
        "started": None,
        "commit": None,
        "curve_equal": True,
        "curve_compared": ["success", "turns", "episodes", "tokens"],
        "evals_equal": True,
        "evals": {"test": {"kept": 0.5, "rerun": 0.5}},
    }
    other = _result("short", 0, 0.5, {}, curve=[0.1, 0.3])
    assert not reproduction(kept, other, "success_rate")["curve_equal"]
    other = _result("short", 0, 0.25, {}, curve=[0.1, 0.2])
    assert reproduction(kept, other, "success_rate")["evals"]["test"] == {
        "kept": 0.5,
        "rerun": 0.25,
    }
    assert not reproduction(kept, other, "success_rate")["evals_equal"]
    results = [dict(kept, rerun_of={"curve_equal": True, "evals_equal": True})]
    results.append(dict(kept, seed=1, rerun_of={"curve_equal": True, "evals_equal": False}))
    line = reruns_line(results)
    assert "2 runs; 1 repeated" in line and line.endswith(
        "show the new run's numbers: short seed 1."
    )
    assert reruns_line([kept]) == ""


def test_a_curve_with_nothing_both_runs_recorded_is_not_called_repeated():
    """An SFT run's points held no training metric (only step and seconds): comparing them
    said `curve_equal: True` whatever the training did. Now its loss is compared, and a
    kept run that recorded nothing the rerun has is 'not compared'."""
    sft = {"evals": {"test": {"success_rate": 0.5}}}
    old = dict(sft, curve=[{"step": 0, "seconds": 1.0}, {"step": 1, "seconds": 2.0}])
    new = dict(sft, curve=[{"step": 0, "seconds": 1.5, "loss": 1.2}, {"step": 1, "loss": 0.9}])
    rerun = reproduction(old, new, "success_rate")
    assert rerun["curve_equal"] is None and rerun["curve_compared"] == []
    moved = dict(sft, curve=[{"step": 0, "loss": 1.2}, {"step": 1, "loss": 0.8}])
    assert reproduction(new, moved, "success_rate")["curve_compared"] == ["loss"]
    assert reproduction(new, moved, "success_rate")["curve_equal"] is False
    assert reproduction(new, json.loads(json.dumps(new)), "success_rate")["curve_equal"] is True
    untrained = dict(sft, curve=[])  # no updates: nothing trained, nothing to differ
    assert reproduction(untrained, dict(untrained), "success_rate")["curve_equal"] is True
    results = [
        dict(sft, arm="sft", seed=0, rerun_of={"curve_equal": None, "evals_equal": True}),
        dict(sft, arm="sft", seed=1, rerun_of={"curve_equal": None, "evals_equal": False}),
        dict(sft, arm="rl", seed=0, rerun_of={"curve_equal": True, "evals_equal": True}),
    ]
    line = reruns_line(results)
    assert "3 runs; 1 repeated" in line
    assert "could not be compared (no training metric recorded in both runs): sft seed 0, " in line
    assert "sft seed 1;" in line
    assert line.endswith("did not repeat, and show the new run's numbers: sft seed 1.")


def test_a_kept_run_gets_added_evaluations_from_its_checkpoint_or_by_training_again(tmp_path):
    """BabyAI smoke runs (real model and env): an evaluation added to the scenario after a
    run was kept is run on the run's final checkpoint, and gives what the same evaluation
    gave inside the run; without the checkpoint the run is trained again and repeats its
    kept curve and evaluations exactly."""
    from dataclasses import replace

    from agentgym_core.plugins import PluginHost

    shipped, host = load_scenario("babyai"), PluginHost()
    both = {name: shipped.evals[name] for name in ("test", "heldout")}
    both["heldout"] = {**both["heldout"], "env": {"list_actions": False}}  # its own env options
    babyai = replace(shipped, evals=both)
    paths, arm = Paths(tmp_path / "data", tmp_path / "work"), babyai.arms["fixed-short"]
    first = run_arm(replace(babyai, evals={"test": both["test"]}), arm, 0, paths, host, smoke=True)
    assert set(first["evals"]) == {"test"}
    added = run_arm(babyai, arm, 0, paths, host, smoke=True)
    assert added["curve"] == first["curve"] and added["evals"]["test"] == first["evals"]["test"]
    assert added["added_evals"]["heldout"]["model"] == "final checkpoint"
    assert added["added_evals"]["heldout"]["env"] == {"list_actions": False}
    assert missing_runs(replace(babyai, seeds=[0]), [first]) == [
        f"{name} seed 0" + (" (no heldout)" if name == "fixed-short" else "")
        for name in babyai.arms
    ]

    shutil.rmtree(final_checkpoint(paths, "babyai", arm.name, 0))  # the checkpoint is gone
    again = {**both, "heldout-again": both["heldout"]}
    rerun = run_arm(replace(babyai, evals=again), arm, 0, paths, host, smoke=True)
    assert rerun["rerun_of"]["curve_equal"] and rerun["rerun_of"]["evals_equal"]
    assert rerun["evals"]["heldout"] == added["evals"]["heldout"]  # checkpoint eval = in-run eval
    assert set(rerun["evals"]) == {"test", "heldout", "heldout-again"}
    assert json.loads(paths.result("babyai", arm.name, 0).read_text()) == rerun


def test_smoke_runs_never_write_where_the_kept_results_are():
    import importlib

    results = importlib.import_module("benchmarks.results")
    kept = results.folders(results.parse_args(["--scenario", "babyai"]))
    assert kept == (results.RESULTS / "data", ROOT / "runs" / "results", results.RESULTS)
    smoke = results.folders(results.parse_args(["--scenario", "babyai", "--smoke"]))
    assert all(not path.is_relative_to(ROOT) for path in smoke)


def test_smoke_mode_runs_every_arm_and_writes_the_report(tmp_path):
    """`--smoke` on BabyAI: a real model, real env, 2 updates per arm, one seed."""
    pytest.importorskip("matplotlib")
    command = [sys.executable, "benchmarks/results.py", "--scenario", "babyai", "--smoke"]
    for name in ("data", "work", "out"):
        command += [f"--{name}", str(tmp_path / name)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {
        p.stem: json.loads(p.read_text()) for p in (tmp_path / "data" / "babyai").glob("*.json")
    }
    rl = ("fixed-short", "fixed-long", "scaling-inter", "gigpo-scaling-inter", "adaptive")
    offline = ("untrained", "sft", "sft-scaling-inter", "evolve")
    assert set(results) == {f"{arm}-seed0" for arm in (*rl, *offline)}
    assert [len(results[f"{arm}-seed0"]["curve"]) for arm in rl] == [2] * 5
    assert results["fixed-long-seed0"]["curve"][0]["horizon"] == 12.0
    assert results["fixed-short-seed0"]["curve"][0]["horizon"] == 4.0
    assert set(results["untrained-seed0"]["evals"]) == {"test", "heldout", "heldout-1200"}
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "| ScalingInter 4-8-12 |" in readme and (tmp_path / "out" / "babyai.png").exists()
    rerun = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0 and "(0 s)" in rerun.stdout  # kept results are skipped


def test_an_evaluation_sets_env_options_for_itself_alone(tmp_path):
    """`evals.<name>.env` reaches that evaluation's stage only, validated by the env plugin."""
    from agentgym_core.config.errors import ConfigError
    from agentgym_core.config.load import load_config
    from agentgym_core.config.stages import expand_stages
    from agentgym_core.plugins import PluginHost

    listed = "  listed: {split: test, max_turns: 4, env: {list_actions: true}}\narms:"
    babyai = "{name: babyai, list_actions: false}"
    text = SCENARIO.replace("arms:", listed, 1).replace("{name: toy}", babyai)
    text = text.replace("config: {env", "config: {algorithm: {name: grpo}, env")
    (tmp_path / "toy.yaml").write_text(text)
    toy, host = load_scenario("toy", tmp_path), PluginHost()

    def stage_options(scenario):
        config = pipeline_config(
            scenario, scenario.arms["short"], 0, tmp_path / "m", tmp_path / "run", smoke=True
        )
        path = tmp_path / "run.yaml"
        path.write_text(json.dumps(config))
        stages = expand_stages(load_config(path, [], host.registry))
        return {s.name: s.config.components["env"][1].list_actions for s in stages}

    assert stage_options(toy) == {"train": False, "eval-test": False, "eval-listed": True}
    toy.evals["listed"] = {"split": "test", "env": {"list_actionz": True}}
    with pytest.raises(ConfigError, match=r"stages\.2\.env\.list_actionz"):
        stage_options(toy)
    (tmp_path / "bad.yaml").write_text(text.replace("{list_actions: true}", "{name: textcraft}"))
    with pytest.raises(SystemExit, match=r"evals\.listed\.env: a mapping of env options"):
        load_scenario("bad", tmp_path)


@pytest.mark.pretrained
def test_a_pretrained_scenario_starts_every_seed_from_the_fetched_model(smollm2_dir, tmp_path):
    from agentgym_core.plugins import PluginHost

    scenario = load_scenario("babyai-smollm2")
    assert scenario.pretrained == "smollm2-135m-instruct"
    host = PluginHost()
    for seed in (0, 1):
        model = build_model(scenario, seed, tmp_path / f"model{seed}", host, smoke=True)
        assert model == smollm2_dir and not (tmp_path / f"model{seed}").exists()


def test_t_intervals_hold_for_any_number_of_seeds_and_no_verdict_under_three():
    """Student's t quantiles computed, not looked up: a table ending at 9 degrees of freedom
    fell back to 1.96 and made 10 or more seeds' intervals about 13% too narrow."""
    from benchmarks.harness.report import _difference
    from benchmarks.harness.stats import half_width, t_quantile

    published = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 10: 2.228, 29: 2.045, 120: 1.980}
    for df, t in published.items():
        assert abs(t_quantile(0.975, df) - t) < 5e-4, df
    ten = [0.1 * i for i in range(10)]
    sd = (sum((v - 0.45) ** 2 for v in ten) / 9) ** 0.5
    assert abs(half_width(ten) - 2.262 * sd / 10**0.5) < 1e-3
    assert _difference([0.5, 0.6]).endswith("2 seeds, no verdict")
    assert _difference([0.5, 0.6, 0.55]).endswith(": shown")
    assert _difference([0.5, -0.6, 0.05]).endswith("no difference shown")


def test_a_runs_machine_names_its_cpu_and_whether_it_has_bf16_instructions():
    """Times depend on it: without bfloat16 instructions a bfloat16 model runs slower."""
    from agentgym_core.modeling.cpu_bf16 import has_native_bf16
    from benchmarks.harness.runner import machine

    facts = machine()
    assert facts["native_bf16"] is has_native_bf16()
    assert isinstance(facts["cpu_model"], str) and facts["cpu_model"]
    assert facts["cpus"] >= 1 and facts["commit"]


def test_others_cpu_share_is_the_machines_busy_time_less_the_runs_own():
    from benchmarks.harness.cpu_share import machine_busy_seconds, others_share

    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal (guest): busy is all but idle and iowait
    stat = f"cpu  {100 * tick} {20 * tick} {30 * tick} {400 * tick} {50 * tick} 6 0 0 0 0\n"
    assert machine_busy_seconds(stat) == pytest.approx(150 + 6 / tick)
    assert others_share(busy=150.0, own=50.0, wall=100.0, cpus=2) == pytest.approx(0.5)
    assert others_share(busy=40.0, own=50.0, wall=100.0, cpus=2) == 0.0  # clock skew: not below 0
    assert others_share(busy=10.0, own=0.0, wall=0.0, cpus=2) == 0.0


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_a_process_beside_the_run_counts_as_others_and_the_runs_own_children_do_not():
    import time

    from benchmarks.harness.cpu_share import CpuShare, own_seconds

    loop = [
        sys.executable,
        "-c",
        "import time\nend = time.time() + 2.5\nwhile time.time() < end: pass",
    ]
    share = CpuShare()
    # a stranger: started through a shell that exits at once, so it is no descendant of ours
    subprocess.run(["sh", "-c", " ".join(f"'{part}'" for part in loop) + " &"], check=True)
    time.sleep(2.5)
    assert share.others() > 0.15  # one busy core of this machine's, less what load takes
    before = own_seconds()
    child = subprocess.Popen(loop)  # ours, still running when measured
    time.sleep(2.0)
    assert own_seconds() - before > 0.3  # its CPU time counts as the run's own
    child.wait()


def test_a_run_whose_machine_others_used_is_marked_shared():
    def run(seed, share):
        return {"scenario": "toy", "arm": "a", "seed": seed, "machine": {"others_cpu_share": share}}

    assert overlapping([run(0, 0.02), run(1, 0.4), run(2, None)]) == {("toy", "a", 1)}


def _counting(marker: Path, kill_below: int, exit_code: int = 0) -> list[str]:
    """A command that counts its starts in `marker`, SIGKILLs itself below `kill_below`."""
    body = (
        "import os, pathlib, signal, sys\n"
        f"p = pathlib.Path({str(marker)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        f"if n < {kill_below}: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"sys.exit({exit_code})\n"
    )
    return [sys.executable, "-c", body]


def test_a_sweep_killed_by_the_kernel_is_started_again_and_nothing_else_is(tmp_path):
    import signal

    from benchmarks.harness.supervise import child_command, supervise

    said = []
    quick = {"pause_s": 0.0, "say": said.append}
    assert supervise(_counting(tmp_path / "a", kill_below=2), 3, **quick) == 0
    assert (tmp_path / "a").read_text() == "3" and len(said) == 2  # killed twice, then done
    assert supervise(_counting(tmp_path / "b", kill_below=0, exit_code=1), 3, **quick) == 1
    assert (tmp_path / "b").read_text() == "1"  # an error is not repeated
    final = supervise(_counting(tmp_path / "c", kill_below=9), 2, **quick)
    assert final == -signal.SIGKILL and (tmp_path / "c").read_text() == "3"
    argv = ["r.py", "--scenario", "x", "--restarts", "3", "--seeds", "0", "--restarts=2"]
    assert child_command(argv) == [sys.executable, "r.py", "--scenario", "x", "--seeds", "0"]
