"""SGLang's `--config` YAML merged into the argv as ConfigArgumentMerger merges it, and the
release tables read as argparse reads them."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.sglang_cli import ArgvError, CliFlag, merge_yaml, parse_cli
from supervisor.core.sglang_launch import LaunchReader
from supervisor.core.sglang_versions import rules_for_version, table_for

NEW = table_for("0.5.23")
OLD = table_for("0.5.20")


def merged(
    argv: list[str], config: dict[str, Any], *, table=NEW, any_spelling=True
) -> tuple[str, ...]:
    return merge_yaml(argv, config, table, all_spellings=any_spelling)


def test_the_file_s_flags_go_first_so_the_command_line_wins():
    out = merged(["--model-path", "m", "--config", "c.yaml", "--tp", "4"], {"tp-size": 8})
    assert out == ("--tp-size", "8", "--model-path", "m", "--tp", "4")
    plan = LaunchReader(rules_for_version("0.5.23"), {"tp-size": 8}).plan(
        ["--model-path", "m", "--config", "c.yaml", "--tp", "4"]
    )
    assert plan.tp_size == 4


def test_switches_lists_dicts_and_booleans_of_valued_flags():
    config = {
        "enable-hierarchical-cache": True,
        "skip-server-warmup": False,
        "numa-node": [0, 1],
        "json-model-override-args": {"a": 1},
        "trust_remote_code": True,
    }
    out = merged(["--config", "c.yaml"], config)
    assert out == (
        "--enable-hierarchical-cache",
        "--numa-node",
        "0",
        "1",
        "--json-model-override-args",
        '{"a": 1}',
        "--trust_remote_code",
    )


def test_a_boolean_for_a_valued_flag_becomes_true_or_false():
    assert merged(["--config", "c.yaml"], {"host": True}) == ("--host", "true")


def test_a_switch_under_another_spelling_is_a_switch_only_from_0_5_23():
    """0.5.23 knows every long spelling of a flag as a key; 0.5.20 only its dest."""
    assert merged(["--config", "c.yaml"], {"enable-hicache": True}) == ("--enable-hicache",)
    old = merged(["--config", "c.yaml"], {"enable-hicache": True}, table=OLD, any_spelling=False)
    assert old == ("--enable-hicache", "true")


def test_a_flag_with_an_action_of_its_own_cannot_come_from_a_file():
    with pytest.raises(
        ArgvError,
        match="Unsupported config option 'enable_tf32_matmul' with action 'BooleanOptionalAction'",
    ):
        merged(["--config", "c.yaml"], {"enable-tf32-matmul": True})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "a.yaml", "--config", "b.yaml"], "Multiple config files specified"),
        (["--model-path", "m", "--config"], "No config file specified after --config flag"),
    ],
)
def test_config_flag_mistakes_are_refused_in_sglang_s_words(argv, message):
    with pytest.raises(ArgvError, match=message):
        merged(argv, {})


def test_without_config_the_argv_is_unchanged():
    assert merged(["--model-path", "m"], {"tp": 8}) == ("--model-path", "m")


def test_yaml_gives_the_same_plan_as_the_equivalent_argv():
    argv = ["--model-path", "m", "--tp-size", "8", "--enable-hierarchical-cache"]
    argv += ["--hicache-size", "48"]
    yaml = {"tp": 8, "enable-hierarchical-cache": True, "hicache-size": 48}
    from_yaml = LaunchReader(rules_for_version("0.5.23"), yaml).plan(
        ["--model-path", "m", "--config", "seed.yaml"]
    )
    from_argv = LaunchReader(rules_for_version("0.5.23")).plan(argv)
    assert (from_yaml.local_ranks, from_yaml.hicache_size_gb) == (8, 48)
    assert from_yaml.uses_hicache
    assert (from_argv.local_ranks, from_argv.hicache_size_gb) == (8, 48)


def test_both_spellings_of_a_boolean_optional_flag_work():
    rules = rules_for_version("0.5.23").cli()
    on = parse_cli(["--model-path", "m", "--enable-tf32-matmul"], rules)
    off = parse_cli(["--model-path", "m", "--no-enable-tf32-matmul"], rules)
    assert (on.values["enable_tf32_matmul"], off.values["enable_tf32_matmul"]) == (True, False)


@pytest.mark.parametrize(
    "flag",
    [
        CliFlag(("--a", "--b"), "a_dest", "+", "int", (1, 2), True, "store"),
        CliFlag(("--x", "--no-x"), "x", 0, "str", None, False, "bool_optional"),
        CliFlag(("--y",), "y", 0, "str", None, False, "custom"),
        CliFlag(("--z",), "z", "?", "float", None, False, "store"),
    ],
)
def test_a_table_entry_reads_back_as_written(flag):
    assert CliFlag.decode(flag.encode()) == flag
