"""Plugins add `agentgym` subcommands through `agentgym_add_commands` (as `serve-policy` does)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from agentgym_core import hookimpl
from agentgym_core.cli import build_parser
from agentgym_core.plugins import BrokenPluginWarning, PluginHost


class Hello:
    @hookimpl
    def agentgym_add_commands(self, subparsers):
        hello = subparsers.add_parser("hello", help="say hello")
        hello.add_argument("name")
        hello.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)


class TakesTrain:
    @hookimpl
    def agentgym_add_commands(self, subparsers):
        subparsers.add_parser("train", help="a second train")


def test_a_plugin_adds_a_command_and_a_taken_name_is_refused_with_a_warning(capsys):
    parser = argparse.ArgumentParser(prog="agentgym")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train")
    host = PluginHost({"hello": Hello(), "takes-train": TakesTrain()}, load_entry_points=False)
    with pytest.warns(BrokenPluginWarning, match="plugin 'takes-train' adds a command the CLI"):
        host.add_commands(sub)
    args = parser.parse_args(["hello", "world"])
    assert args.func(args) == 0 and capsys.readouterr().out == "hello world\n"
    assert parser.parse_args(["train"]).command == "train"


def test_serve_policy_comes_from_the_vllm_plugin():
    pytest.importorskip("agentgym_policy_vllm")
    commands = build_parser()._subparsers._group_actions[0].choices
    assert commands["serve-policy"].prog == "agentgym serve-policy"
    done = subprocess.run(
        [sys.executable, "-m", "agentgym_core.cli", "serve-policy", "--help"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "--replicas" in done.stdout
