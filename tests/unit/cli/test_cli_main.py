"""The asyncrl command: lazy subcommand registry, import footprint, one-line errors, config show/docs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from asyncrl.cli import main as cli
from asyncrl.cli.args import split_config_args
from asyncrl.config.base import ConfigError, iter_key_docs
from asyncrl.config.loader import to_yaml
from asyncrl.config.run import RunConfig, load_run_config

HEAVY = ("torch", "transformers", "tokenizers", "ray")


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"    {name} " in out


def test_building_any_parser_imports_nothing_heavy():
    """Each subcommand's parser is built in a fresh interpreter; none may pull torch & co. at import."""
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        from asyncrl.cli.main import COMMANDS, build_parser
        report = {{}}
        for argv in [[], *[[name] for name, (path, _) in COMMANDS.items() if importlib.util.find_spec(path)]]:
            build_parser(argv)
            report[" ".join(argv) or "--help"] = sorted(m for m in {HEAVY!r} if m in sys.modules)
        print(json.dumps(report))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert {"--help", "config", "tiny"} <= set(report)
    assert report == {command: [] for command in report}


def test_config_show_prints_the_resolved_yaml(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 4\nengine:\n  max_running_requests: 2\n")
    assert cli.main(["config", "show", str(path), "model.device=cpu"]) == 0
    expected = load_run_config(str(path), ["model.device=cpu"])
    assert capsys.readouterr().out == to_yaml(expected)
    assert expected.seed == 4 and expected.engine.max_running_requests == 2


def test_config_show_without_file_takes_defaults_and_overrides(capsys):
    assert cli.main(["config", "show", "seed=9"]) == 0
    assert capsys.readouterr().out == to_yaml(RunConfig(seed=9))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["config", "show", "engine.max_kv_tokn=1"],
            "unknown key 'engine.max_kv_tokn' (did you mean 'engine.max_kv_tokens'?)",
        ),
        (
            ["config", "show", "model.dtype=fp8"],
            "model.dtype must be one of 'float32', 'bfloat16', 'float16', got 'fp8'",
        ),
        (["config", "show", "missing.yaml"], "config file not found: missing.yaml"),
        (
            ["config", "show", "seed=1", "stray"],
            "expected key=value overrides after the config file, got 'stray'",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_on_stderr(argv, message, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("asyncrl: error: config: ")
    assert message in captured.err
    assert captured.err.count("\n") == 1


def test_traceback_flag_lets_the_error_through():
    with pytest.raises(ConfigError, match="unknown key 'sed'"):
        cli.main(["--traceback", "config", "show", "sed=1"])


def test_config_docs_lists_every_key_with_its_doc(capsys):
    assert cli.main(["config", "docs"]) == 0
    out = capsys.readouterr().out
    for doc in iter_key_docs(RunConfig):
        assert f"{doc.key}: {doc.type_name} = {doc.default!r}\n" in out
    assert "engine.kv_on_update: Literal['keep', 'recompute'] = 'keep'\n    On a weight update" in out


def test_config_docs_filters_by_prefix(capsys):
    assert cli.main(["config", "docs", "model."]) == 0
    keys = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert keys == [
        "model.path",
        "model.revision",
        "model.local_files_only",
        "model.dtype",
        "model.device",
        "model.attn_implementation",
    ]


FAKE_COMMAND = """
def add_parser(subparsers):
    parser = subparsers.add_parser("hello", help="say hello")
    parser.add_argument("--fail", action="store_true")

def run(args):
    if args.fail:
        raise ValueError("bad\\ninput")
    print("hello")
    return 3
"""


@pytest.fixture
def fake_commands(monkeypatch, tmp_path):
    (tmp_path / "fake_hello_command.py").write_text(FAKE_COMMAND)
    monkeypatch.syspath_prepend(str(tmp_path))
    commands = {"hello": ("fake_hello_command", "say hello"), "gone": ("no_such_cli_module_x", "missing")}
    monkeypatch.setattr(cli, "COMMANDS", commands)


def test_registered_module_runs_and_returns_its_status(fake_commands, capsys):
    assert cli.main(["hello"]) == 3
    assert capsys.readouterr().out == "hello\n"


def test_value_error_from_a_command_becomes_one_line(fake_commands, capsys):
    assert cli.main(["hello", "--fail"]) == 2
    assert capsys.readouterr().err == "asyncrl: error: hello: bad input\n"


def test_missing_module_breaks_only_its_own_command(fake_commands, capsys):
    assert cli.main(["gone"]) == 2
    assert capsys.readouterr().err == (
        "asyncrl: error: command 'gone' is not available: module no_such_cli_module_x is missing\n"
    )
    assert cli.main(["hello"]) == 3


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["trian"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([], (None, [])),
        (["a.yaml"], ("a.yaml", [])),
        (["a.yaml", "x=1", "y.z=[1]"], ("a.yaml", ["x=1", "y.z=[1]"])),
        (["x=1"], (None, ["x=1"])),
    ],
)
def test_split_config_args(items, expected):
    assert split_config_args(items) == expected
