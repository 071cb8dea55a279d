"""Finding checkpoints: half-written `.tmp` folders left by a crash are never resumed from."""

from agentgym_core.run.checkpoint import STATE_FILE, latest_checkpoint, prune_checkpoints


def test_latest_ignores_unfinished_and_tmp(tmp_path):
    root = tmp_path / "checkpoints"
    for name, state in [
        ("step-000002", True),
        ("step-000004", True),
        ("step-000006.tmp", True),
        ("step-000008", False),
    ]:
        (root / name).mkdir(parents=True)
        if state:
            (root / name / STATE_FILE).write_bytes(b"x")
    assert latest_checkpoint(tmp_path).name == "step-000004"
    prune_checkpoints(tmp_path, keep=1)
    assert not (root / "step-000002").exists() and (root / "step-000004").exists()
    assert latest_checkpoint(tmp_path / "nothing") is None
