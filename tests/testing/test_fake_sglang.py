"""The simulated SGLang server as real processes: titles, memory, health lifecycle, signals."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from supervisor.core.classify import DeathContext, FailureKind, classify, killed_itself
from supervisor.core.log_phases import marks_in
from supervisor.testing.scenario import parse_scenario
from tests.testing.support import fake_server_env, http_json, run_fake_to_exit
from tests.waiting import wait_until

HICACHE_50GB = ["--enable-hierarchical-cache", "--hicache-size", "50"]


def _shmem_bytes(proc: psutil.Process) -> int:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssShmem line")


def test_ranks_are_titled_like_sglang_and_stay_in_the_launchers_process_group(start_fake_server):
    server = start_fake_server(["--tp-size", "2"])
    wait_until(lambda: len(server.titled()) == 3, what="two ranks and a detokenizer")
    titled = server.titled()
    assert set(titled) == {"sglang::scheduler_TP0", "sglang::scheduler_TP1", "sglang::detokenizer"}
    for proc in titled.values():
        assert proc.ppid() == server.proc.pid
        assert os.getpgid(proc.pid) == server.proc.pid


def test_a_single_rank_is_plain_sglang_scheduler(start_fake_server):
    server = start_fake_server()
    wait_until(lambda: len(server.titled()) == 2, what="a rank and a detokenizer")
    assert "sglang::scheduler" in server.titled()


def test_health_is_refused_then_503_while_warming_then_200(start_fake_server):
    server = start_fake_server(scenario={"startup_s": 0.3, "warmup_s": 0.5})
    assert server.status() is None  # still loading: the port is not bound yet
    wait_until(lambda: server.status() == 503, what="/health 503 while warming up")
    assert server.status("/ready") == 503
    wait_until(lambda: server.status() == 200, what="/health 200 once up")
    assert server.status("/ready") == 200
    assert server.status("/health_generate") == 200
    assert "The server is fired up and ready to roll!" in server.log_text()


def test_the_health_delay_is_sglangs_one_second_by_default():
    """SGLang's /health sleeps 1 s before it looks at its one-token generation, and the
    scheduler logs that generation's prefill: by default the simulation does the same."""
    assert parse_scenario("").health_delay_s == 1.0


def test_each_health_probe_waits_for_the_delay_and_logs_a_prefill_line(start_fake_server):
    server = start_fake_server(["--tp-size", "2"], scenario={"health_delay_s": 0.3})
    wait_until(lambda: server.status() == 200, what="/health 200 once up")
    before = len(server.log_lines("Prefill batch, #new-seq: 1, #new-token: 1"))
    started_s = time.monotonic()
    assert server.status() == 200
    assert time.monotonic() - started_s >= 0.3  # a lower bound: never early, however loaded
    prefills = server.log_lines("Prefill batch, #new-seq: 1, #new-token: 1")
    assert len(prefills) == before + 1
    assert " TP0] Prefill batch" in prefills[-1]  # rank 0's scheduler logs it


def test_each_rank_holds_its_host_pool_as_shared_memory_scaled_by_bytes_per_gb(start_fake_server):
    bytes_per_gb = 64 * 1024
    server = start_fake_server(["--tp-size", "2", *HICACHE_50GB], bytes_per_gb=bytes_per_gb)
    wait_until(lambda: server.status() == 200, what="server up")
    ranks = [p for t, p in server.titled().items() if t.startswith("sglang::scheduler")]
    detok = server.titled()["sglang::detokenizer"]
    pool_real_bytes = 50 * bytes_per_gb
    for rank in ranks:
        assert _shmem_bytes(rank) - _shmem_bytes(detok) >= pool_real_bytes * 0.99
    assert "Allocating kv hierarchical KV host pool:" in server.log_text()


def test_server_info_reports_max_total_num_tokens(start_fake_server):
    server = start_fake_server(scenario={"max_total_num_tokens": 123456})
    wait_until(lambda: server.status() == 200, what="server up")
    info = http_json(server.port, "/server_info")
    assert info["max_total_num_tokens"] == 123456
    assert http_json(server.port, "/v1/models")["data"][0]["id"] == "fake/model"
    assert http_json(server.port, "/model_info")["model_path"] == "fake/model"
    assert server.status("/metrics") == 404  # only with --enable-metrics


def test_metrics_use_sglang_names_with_enable_metrics(start_fake_server):
    server = start_fake_server(["--enable-metrics"])
    wait_until(lambda: server.status() == 200, what="server up")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    assert "sglang:max_total_num_tokens{" in body
    assert "sglang:num_running_reqs{" in body


def test_a_crashed_rank_takes_the_tree_down_after_the_crash_dump_wait(start_fake_server):
    server = start_fake_server(
        ["--tp-size", "2"],
        scenario={"crash": {"rank": 1, "after_s": 1.0, "exit_code": 1}, "crash_dump_wait_s": 0.3},
    )
    wait_until(lambda: server.status() == 200, what="server up")
    ranks = server.titled()
    # SGLang's kill_process_tree kills itself.
    assert server.proc.wait(timeout=10) == -signal.SIGKILL
    log = server.log_text()
    assert " TP1] Scheduler hit an exception" in log
    # The warmup's request installed the tokenizer manager's handler (running phase).
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert "include_parent=True" in log
    wait_until(
        lambda: not any(p.is_running() and p.status() != "zombie" for p in ranks.values()),
        what="every child gone",
    )


def test_a_rank_killed_by_a_signal_is_noticed_by_the_subprocess_watchdog(start_fake_server):
    server = start_fake_server(
        ["--tp-size", "2"], scenario={"crash": {"rank": 0, "after_s": 0.1, "signal": "SIGKILL"}}
    )
    assert server.proc.wait(timeout=10) == -signal.SIGKILL
    assert "crashed with exit code -9. Triggering SIGQUIT for cleanup..." in server.log_text()


@pytest.mark.parametrize(
    ("crash", "handler"),
    [
        # At init: the rank's SIGQUIT reaches engine.py's launch-phase handler.
        ({"rank": 1, "after_s": 0.0, "exit_code": 1}, "Received sigquit from a child process"),
        # Running: a rank SIGKILLed (by anyone) is the SubprocessWatchdog's, then the
        # tokenizer manager's handler.
        ({"rank": 1, "after_s": 1.0, "signal": "SIGKILL"}, "SIGQUIT received."),
    ],
)
def test_the_simulated_self_kill_reads_as_sglangs_own_not_the_oom_killers(
    start_fake_server, crash, handler
):
    """The main process dies by its own SIGKILL after a child failed; the product's classifier,
    given its log and a kernel that counted no OOM kill, names the self-kill."""
    server = start_fake_server(
        ["--tp-size", "2"], scenario={"crash": crash, "crash_dump_wait_s": 0}
    )
    assert server.proc.wait(timeout=30) == -signal.SIGKILL
    tail = server.log_text().splitlines()
    assert any(handler in line for line in tail)
    assert killed_itself(9, marks_in(tail))
    result = classify(None, 9, tail, DeathContext(oom_kills=0, tree_oom_kills=0))
    assert result.kind is FailureKind.RANK_CRASH
    assert "killed its own tree after a child failed" in result.hint


def test_bad_flags_exit_2_with_an_argparse_message_before_starting():
    env = fake_server_env({"bad_flags": ["--foo"]})
    result = run_fake_to_exit(["--model-path", "m", "--foo", "1"], env)
    assert result.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --foo" in result.stderr


def test_a_malformed_scenario_exits_2_naming_the_key():
    env = fake_server_env({"crash": {"rank": 0, "after": 1, "signal": "SIGKILL"}})
    result = run_fake_to_exit(["--model-path", "m"], env)
    assert result.returncode == 2
    assert "crash.after" in result.stderr
    assert "Traceback" not in result.stderr


def test_pool_is_sized_from_the_models_config_as_sglang_sizes_it(start_fake_server, tmp_path):
    model = tmp_path / "deepseek"
    model.mkdir()
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "hidden_size": 7168,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "torch_dtype": "bfloat16",
    }
    (model / "config.json").write_text(json.dumps(config))
    server = start_fake_server(
        [
            "--model-path",
            str(model),
            "--tp-size",
            "2",
            "--enable-hierarchical-cache",
            "--hicache-size",
            "10",
        ],
    )
    wait_until(lambda: server.status() == 200, what="server up")
    # MLA: (512 + 64) × 61 layers × 2 bytes = 70,272 B per token on every rank; 10 GB of it is
    # int(10e9 // 70272) = 142,304 tokens, plus SGLang's one padding page; 142,305 × 70,272 B
    # = 10.00 GB. The pool of a plain model is labelled "kv" (build_kv_host_pool).
    assert (
        "Allocating kv hierarchical KV host pool: 142305 tokens, 10.00 GB host memory."
        in server.log_text()
    )


def test_the_api_key_guards_info_and_is_printed_in_clear_as_sglang_does(start_fake_server):
    """/server_info hides it; the server_args line shows it (ServerArgs.resolved_dict), which
    the supervisor must mask in the server's output."""
    server = start_fake_server(["--api-key", "s3cret-value"])
    wait_until(lambda: server.status() == 200, what="server up")  # /health is not guarded
    assert server.status("/server_info") == 401
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/server_info", headers={"Authorization": "Bearer s3cret-value"})
    body = conn.getresponse().read().decode()
    conn.close()
    assert "launch_command" in body
    assert "s3cret-value" not in body
    assert "'api_key': 's3cret-value'" in server.log_text()
