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
