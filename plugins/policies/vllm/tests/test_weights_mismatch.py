"""A failed weight probe stops the command with one line naming the gap, not a traceback."""

from __future__ import annotations

from agentgym_policy_vllm.weights import WeightsMismatch

from agentgym_core import cli


def test_a_weights_mismatch_is_a_clean_error_of_the_command(monkeypatch, capsys):
    def failing(args):
        raise WeightsMismatch("vllm: the probe's log-probs are 1.5e-03 from the learner's")

    monkeypatch.setattr(cli, "cmd_plugins", failing)
    assert cli.main(["plugins"]) == 2
    err = capsys.readouterr().err
    assert err == "agentgym: error: vllm: the probe's log-probs are 1.5e-03 from the learner's\n"
