"""The flag tables the supervisor reads argv with, against each release's own source."""

from __future__ import annotations

from supervisor.core import sglang_cli_data
from supervisor.core.sglang_flags import OPTIONS
from supervisor.core.sglang_versions import table_for
from tests.contract.conftest import source_of
from tests.contract.sglang_source import read_flags
from tests.contract.tables import to_cli_flag


def test_the_table_matches_the_release_s_add_cli_args(version: str):
    """Names, aliases, dest, arity, type and choices of every flag, nothing more or less."""
    source = {name: to_cli_flag(f) for name, f in read_flags(source_of(version) / "srt").items()}
    table = {f.names[0]: f for f in table_for(version).flags}
    assert sorted(set(source) - set(table)) == [], "flags the table lacks"
    assert sorted(set(table) - set(source)) == [], "flags the release does not have"
    differ = [name for name in source if source[name] != table[name]]
    assert differ == [], {n: (table[n], source[n]) for n in differ[:5]}


def test_every_flag_the_supervisor_interprets_exists_with_its_arity(version: str):
    """In the newest release every spelling exists; older ones may lack later aliases."""
    table = table_for(version)
    newest = version == sglang_cli_data.NEWEST
    for option in OPTIONS:
        for name in option.names:
            flag = table.flag(name)
            assert flag is not None or not newest, f"{name} in SGLang {version}"
            if flag is not None:
                assert (flag.nargs != 0) == (option.convert is not None), (name, flag)
