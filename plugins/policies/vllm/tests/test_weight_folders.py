"""The `vllm_server` policy's weights folders: which a sync's cleanup keeps (no vLLM needed).

A rollout thread's sync cleans up while the learner may be writing the next
version (`stage_weights`): what it keeps must include that version's `.tmp`.
"""

from __future__ import annotations

from agentgym_policy_vllm.weight_folders import PREFIX, remove_all_but, version_of


def test_cleanup_keeps_the_named_versions_with_their_marks_and_partial_writes(tmp_path):
    names = [f"{PREFIX}000001", f"{PREFIX}000002", f"{PREFIX}000003", f"{PREFIX}000050-abc"]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / f"{name}.synced").write_text("[]")
    (tmp_path / f"{PREFIX}000004.tmp").mkdir()  # being written by stage_weights
    (tmp_path / "other").mkdir()  # not ours
    remove_all_but(tmp_path, [f"{PREFIX}000002", f"{PREFIX}000004"])
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == [f"{PREFIX}000002", f"{PREFIX}000002.synced", f"{PREFIX}000004.tmp", "other"]


def test_version_of_reads_the_sync_number():
    assert version_of(f"{PREFIX}000012-0123456789ab") == 12
    assert version_of(f"/some/dir/{PREFIX}000007") == 7
    assert version_of("other") == -1
