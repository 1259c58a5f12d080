"""`sglang-supervisor preflight` refuses what it cannot plan (exit 2, the input named), fails
what SGLang would fail at load (exit 1), and never prints a line that would launch wrongly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from supervisor.preflight import run_preflight
from tests.preflight.support import KIMI_ARGS, LLAMA, ROOT, SEED_FACTS, run, run_json
from tests.preflight.test_measured import fake_host, measured_config

LLAMA_FACTS = ["--mem-available", "1000GiB", "--gpus", "8", "--gpu-memory", "81559MiB"]
LLAMA_FACTS += ["--weights", "141GB", "--model-config", str(LLAMA)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-memory", "0"], "'--gpu-memory': must be at least 1 GiB"),
        (["--gpu-memory", "0GB"], "'--gpu-memory': must be at least 1 GiB"),
        (["--gpu-memory", "0.5GiB"], "'--gpu-memory': must be at least 1 GiB"),
        (["--mem-available", "445"], "'--mem-available': 445 has no unit: write 445GB or 445GiB"),
        (["--weights", "595"], "'--weights': 595 has no unit"),
        (["--numa", "0:200:0-7"], "--numa '0:200:0-7': 200 has no unit"),
        (["--numa", "0:200GB:9-12"], "GPU(s) 9, 10, 11, 12 beyond the 8 GPUs"),
        (["--numa", "0:200GB:7-4"], "--numa '0:200GB:7-4': the GPU range 7-4 runs backwards"),
    ],
)
def test_bad_host_facts_exit_2_naming_the_option(capsys, args, message):
    code, out, err = run(capsys, "preflight", *SEED_FACTS, *args, "--", *KIMI_ARGS)
    assert code == 2
    assert message in err
    assert "Traceback" not in err + out


def test_numa_nodes_that_hold_none_of_the_launch_s_gpus_are_refused(capsys):
    """Without --gpus: the launch's GPUs 0-7 are on no node given, so no node would be checked."""
    facts = [a for a in SEED_FACTS if a not in ("--gpus", "8")]
    numa = ["--numa", "0:200GB:9-12"]
    code, _out, err = run(capsys, "preflight", *facts, *numa, "--", *KIMI_ARGS)
    assert code == 2
    assert "GPU(s) 0, 1, 2, 3, 4, 5, 6, 7 of this launch are on no NUMA node" in err


@pytest.mark.parametrize("ratio", ["NaN", "nan", "inf", "-inf", "-1", "0"])
def test_a_hicache_ratio_that_is_no_finite_positive_number_exits_2(capsys, ratio):
    args = [*KIMI_ARGS, f"--hicache-ratio={ratio}"]  # "=": argparse reads "-1" as a value
    code, out, err = run(capsys, "preflight", *SEED_FACTS, "--", *args)
    assert code == 2
    assert "--hicache-ratio" in err
    assert "must be a finite positive number" in err
    assert "×" not in out


@pytest.mark.timeout(10)  # a regression blocks in open() on the FIFO: fail, never hang
def test_a_fifo_as_the_model_config_exits_2(capsys, tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    facts = [*SEED_FACTS, "--model-config", str(fifo)]  # the last one given wins
    code, _out, err = run(capsys, "preflight", *facts, "--", *KIMI_ARGS)
    assert code == 2
    assert f"model config {fifo} is not a regular file (a FIFO)" in err


def test_a_fifo_given_anywhere_exits_2_in_a_subprocess_with_a_deadline(tmp_path):
    """The whole command, as an operator runs it: `--config` and `[server] model_config` FIFOs."""
    config_fifo = tmp_path / "fifo.toml"
    os.mkfifo(config_fifo)
    model_fifo = tmp_path / "config.json"
    os.mkfifo(model_fifo)
    toml = tmp_path / "c.toml"
    toml.write_text('[server]\nmodel_config = "config.json"\n')
    for config in (config_fifo, toml):
        command = [sys.executable, "-m", "supervisor", "preflight", *SEED_FACTS[:6]]
        done = subprocess.run(
            [*command, "--weights", "1GB", "--config", str(config), "--", *KIMI_ARGS],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert done.returncode == 2, done.stderr
        assert "is not a regular file (a FIFO)" in done.stderr


@pytest.mark.parametrize(
    ("tp", "detail"),
    [
        ("3", "--tp-size 3 does not divide the 64 attention heads"),
        ("6", "--tp-size 6 does not divide the 64 attention heads"),
    ],
)
def test_a_tp_that_cannot_split_the_heads_fails_the_preflight(capsys, tp, detail):
    args = ["--model-path", "meta-llama/Llama-3-70B", "--tp", tp]
    code, data = run_json(capsys, *LLAMA_FACTS, "--", *args)
    assert code == 1
    failed = {c["name"]: c["detail"] for c in data["checks"] if c["status"] == "fail"}
    assert detail in failed["attention_heads"]


def test_print_args_writes_secrets_as_shell_variables(capsys):
    args = [*KIMI_ARGS, "--hicache-size", "300", "--api-key", "s3cret"]
    args += ["--admin-api-key=t0p s3cret"]
    code, out, err = run(capsys, "preflight", "--print-args", *SEED_FACTS, "--", *args)
    assert code == 0
    line = out.strip()
    assert line.endswith('--hicache-size 49 --api-key "$API_KEY" --admin-api-key="$ADMIN_API_KEY"')
    assert "s3cret" not in out + err
    assert err.count("\n") == 1
    assert "API_KEY" in err
    assert "ADMIN_API_KEY" in err
    # The shell gives the server the keys from the environment, each as one word.
    env = {"API_KEY": "k 1", "ADMIN_API_KEY": "k*2", "PATH": os.environ["PATH"]}
    words = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {line}"], env=env, capture_output=True, text=True
    ).stdout.splitlines()
    assert words[words.index("--api-key") + 1] == "k 1"
    assert "--admin-api-key=k*2" in words


def test_print_args_without_hicache_prints_the_argv_unchanged(capsys):
    args = ["--model-path", "moonshotai/Kimi-K2.5", "--tp", "8", "--port", "30001"]
    code, out, err = run(capsys, "preflight", "--print-args", *SEED_FACTS, "--", *args)
    assert code == 0
    assert out.strip() == " ".join(args)
    assert "HiCache is off" in err


def test_without_hicache_a_launch_that_does_not_fit_says_so(capsys):
    facts = [*SEED_FACTS, "--mem-available", "40GB"]  # the last one given wins
    args = ["--model-path", "moonshotai/Kimi-K2.5", "--tp", "8"]
    code, out, err = run(capsys, "preflight", "--print-args", *facts, "--", *args)
    assert (code, out) == (1, "")
    assert "does not fit even without HiCache" in err
    code, out, _ = run(capsys, "preflight", *facts, "--", *args)
    assert code == 1
    assert "does not fit even without HiCache" in out
    assert "leave HiCache off" not in out
    _, data = run_json(capsys, *facts, "--", *args)
    assert data["suggested_argv"] is None


def test_json_suggests_the_argv_unchanged_when_hicache_is_off(capsys):
    args = ["--model-path", "moonshotai/Kimi-K2.5", "--tp", "8"]
    code, data = run_json(capsys, *SEED_FACTS, "--", *args)
    assert code == 0
    assert data["suggested_argv"] == args


def test_gpu_holders_are_not_checked_when_no_gpu_was_read(tmp_path):
    args = [*KIMI_ARGS, "--hicache-size", "48"]
    report = run_preflight(
        measured_config(), args, gpu_sensor=None, probe=fake_host(tmp_path), env={}
    )
    holders = next(c for c in report.checks if c.name == "gpu_holders")
    assert holders.status.value == "warn"
    assert "not checked" in holders.detail
    assert json.dumps(report.to_json())  # still a complete report
