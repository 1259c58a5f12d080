"""Secrets never reach logs: env values by name, API keys inside text."""

from __future__ import annotations

import pytest

from supervisor.core.redact import Redactor, redact_env, redact_line, secret_values
from supervisor.core.sglang_args import parse_launch_args


def test_env_values_with_secret_names_are_masked():
    env = {"HF_TOKEN": "hf_abc", "MY_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s", "PATH": "/bin"}
    assert redact_env(env) == {
        "HF_TOKEN": "***",
        "MY_API_KEY": "***",
        "AWS_SECRET_ACCESS_KEY": "***",
        "PATH": "/bin",
    }


def test_api_keys_and_secret_env_values_are_masked_inside_lines():
    argv = ["--model-path", "m", "--api-key", "sk-live-1234", "--admin-api-key=adm-9999"]
    plan = parse_launch_args(argv)
    secrets = secret_values(plan, {"HF_TOKEN": "hf_secretvalue", "PATH": "/usr/bin"})
    redact = Redactor(secrets)
    line = "server_args=ServerArgs(api_key='sk-live-1234', admin_api_key='adm-9999') hf_secretvalue"
    out = redact(line)
    assert "sk-live-1234" not in out
    assert "adm-9999" not in out
    assert "hf_secretvalue" not in out
    assert out.count("***") == 3
    assert redact("/usr/bin is not a secret") == "/usr/bin is not a secret"


def test_very_short_values_are_not_used_as_masks():
    assert secret_values(None, {"X_TOKEN": "a"}) == ()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("python -m sglang.launch_server --api-key sk-1234 --tp 8", "--api-key *** --tp 8"),
        ("--admin-api-key=adm-5678", "--admin-api-key=***"),
        ("env HF_TOKEN=hf_abcdef python", "HF_TOKEN=*** python"),
        ("MY_SECRET_VALUE=xyz1 OTHER=keep", "MY_SECRET_VALUE=*** OTHER=keep"),
    ],
)
def test_redact_line_hides_secrets_it_was_not_told_about(line: str, expected: str) -> None:
    assert redact_line(line).endswith(expected)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("SMTP_PASSWD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("OPENAI_APIKEY", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("KEYBOARD_LAYOUT", False),
        ("PATH", False),
    ],
)
def test_a_name_is_secret_by_its_underscore_separated_parts(name: str, secret: bool) -> None:
    assert redact_env({name: "value"})[name] == ("***" if secret else "value")


def test_the_inherited_environment_is_masked_from_eight_characters_on():
    env = {"HF_TOKEN": "hf_abcdefgh", "SHORT_TOKEN": "1234567", "TOKENIZERS_PARALLELISM": "false"}
    assert secret_values(None, env) == ("hf_abcdefgh",)
    redact = Redactor(secret_values(None, env))
    assert redact("loading with hf_abcdefgh from the hub") == "loading with *** from the hub"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "curl -H 'Authorization: Bearer hf_xyz.123' url",
            "curl -H 'Authorization: Bearer ***' url",
        ),
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: ***"),
        ("token=Bearer abc", "token=*** ***"),
        ("{'api_key': 'sk-live', 'tp_size': 8}", "{'api_key': '***', 'tp_size': 8}"),
        ('{"hf_token": "hf_x", "model": "m"}', '{"hf_token": "***", "model": "m"}'),
        ("TOKENIZERS_PARALLELISM=false ok", "TOKENIZERS_PARALLELISM=false ok"),
    ],
)
def test_bearer_authorization_and_mapping_items_are_masked_by_shape(line: str, expected: str):
    assert redact_line(line) == expected


# -- secrets in every shape ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("reset --token tk-123456 -i 0", "reset --token *** -i 0"),
        ("tool --password hunter2", "tool --password ***"),
        ("tool --db-password='two words' x", "tool --db-password='***' x"),
        ("tool --client-secret=cs-1 --x", "tool --client-secret=*** --x"),
        ("tool --hf-token hf_abc", "tool --hf-token ***"),
        ("tool --x-api-key k-1", "tool --x-api-key ***"),
        ("tool --auth-token\tabc", "tool --auth-token\t***"),
        (
            "sglang --ssl-keyfile-password pw-9 --port 1",
            "sglang --ssl-keyfile-password *** --port 1",
        ),
        ("curl https://user:pa55@host:8443/v1", "curl https://user:***@host:8443/v1"),
        ("postgres://svc:p%40ss@db/x", "postgres://svc:***@db/x"),
        ("env AWS_SECRET_ACCESS_KEY='a b' run", "env AWS_SECRET_ACCESS_KEY='***' run"),
        ('api_key="quoted"', 'api_key="***"'),
    ],
)
def test_secret_flags_urls_and_assignments_are_masked_in_any_spelling(line: str, expected: str):
    assert redact_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "--ssl-keyfile /etc/tls/key.pem",  # a path: "keyfile" is not the word "key"
        "--tokenizer-path /models/tok",
        "--max-total-tokens 131072",
        "--speculative-token-map /data/map.pt",  # SGLang's: a file of token ids
        "--kt-max-deferred-experts-per-token 4",  # SGLang's: a number
        "https://host/path?q=1",
        "git://user@host/repo",  # a user name alone is no secret
        "TOKENIZERS_PARALLELISM=false",
    ],
)
def test_names_that_only_contain_a_secret_word_are_not_masked(line: str):
    assert redact_line(line) == line


def test_a_command_is_masked_word_by_word_whatever_its_values_hold():
    from supervisor.core.redact import command_secrets, redact_command, redact_words

    words = ["hv-reset", "--token", "tok en'1", "--url=https://u:secretpw@h/x", "DB_PASSWORD=p w"]
    assert redact_words(words) == (
        "hv-reset",
        "--token",
        "***",
        "--url=https://u:***@h/x",
        "DB_PASSWORD=***",
    )
    shown = redact_command(words)
    assert "tok en" not in shown
    assert "secretpw" not in shown
    assert "p w" not in shown
    # Found by shape, these are masked everywhere from eight characters on.
    assert set(command_secrets(["x", "--api-key", "k", "--token", "longtoken-1", "A_KEY=v" * 2]))
    assert command_secrets(["x", "--token", "longtoken-1", "A_KEY=short"]) == ("longtoken-1",)


def test_secret_values_include_every_secret_flag_and_the_commands():
    argv = ["--model-path", "m", "--ssl-keyfile-password", "pw-ssl-1", "--api-key", "k"]
    plan = parse_launch_args(argv)
    values = secret_values(plan, {}, commands=[["reset", "--token", "reset-token-1"]])
    assert set(values) == {"pw-ssl-1", "k", "reset-token-1"}


def test_a_known_secret_cut_in_two_by_a_line_cut_is_masked_on_both_sides():
    secret = "sk-0123456789abcdef"
    text = "key sk-0123456 …[cut 5000 bytes]… 789abcdef end"
    out = Redactor([secret])(text)
    assert "0123456" not in out
    assert "789abcdef" not in out
    assert out == "key *** …[cut 5000 bytes]… *** end"


def test_a_few_characters_at_a_cut_that_begin_a_secret_are_left():
    # Three characters tell nothing and may be anything's: only four or more are masked.
    assert Redactor(["sk-0123456789"])("x sk- …[cut 9 chars]… y") == "x sk- …[cut 9 chars]… y"
