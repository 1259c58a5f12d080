"""Simulated SGLang server and simulated GPUs: the test bed the supervisor is tested against.

Shipped with the product (the `demo` and a GPU-less systemd trial use it) but imported by the
product only when the GPU backend `sim` is chosen. Facts imitated: docs/sglang.md (SGLang 0.5.23).

Launch (exactly SGLang's argv after the module):
    python -m supervisor.testing.fake_sglang --model-path M [launch_server flags ...]
Topology and sizing flags are read with argparse as SGLang reads them (supervisor/testing/args.py,
independent of the supervisor's own reader); other flags are accepted and ignored, as long as
they are not in the scenario's `bad_flags`.

Environment variables
    FAKE_SGLANG_SCENARIO      JSON object of scenario keys (below); unset/empty = happy path.
    FAKE_SGLANG_BYTES_PER_GB  real bytes allocated per simulated GB (1e9 B); default 1048576
                              (1 MiB per GB). A 50 GB host pool at the default is 50 MiB.
    FAKE_GPU_STATE_DIR        simulated GPUs (format below); unset = no GPU registration.
    FAKE_SGLANG_MARKER        not read by the fake: every simulated process keeps its inherited
                              environment readable in /proc/PID/environ (SPT_NOENV=1), so the
                              test suite's leak guard finds them by this marker.
    SPT_NOENV                 set to 1 by the children before setproctitle (see above).

Scenario keys (FAKE_SGLANG_SCENARIO; seconds `_s`, bytes `_bytes`, "GB" scaled as above;
`after_s` counts from the end of that rank's load; unknown keys or wrong types exit 2)
    startup_s              0.2   load time per rank: the port refuses connections meanwhile
    warmup_s               0.1   after binding: /health and /ready 503 ("Starting"), then 200
    drain_s                0.1   SIGTERM: time spent draining (SGLang: polls + 15 s wait)
    crash_dump_wait_s      0.2   crash path: HTTP frozen this long before the tree is SIGKILLed
                                 (SGLang: 5 s + py-spy + 60 s coredump wait ≈ 65 s)
    health_check_timeout_s 2.0   /health waits this long for every rank to answer a ping
                                 (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s in SGLang)
    runtime_gb             4.0   private anonymous memory per rank (torch/CUDA/NCCL runtime)
    gpu_total_bytes        -     GPU size for sizing when no state dir (default H200, 143771 MiB)
    weight_bytes_per_rank  20 GiB  weights on each GPU, for the device KV pool
    cuda_context_bytes     0     GPU memory taken before SGLang measures free memory
    max_total_num_tokens   -     device KV tokens per rank (default: sized as SGLang sizes it)
    leak                   {rank 0, bytes_per_s 1 MiB, after_s 0, max_bytes 32 MiB,
                            kind "anon"|"shmem"}: real bytes (not scaled), touched, growing
                           until max_bytes; anon shows as RssAnon, shmem as RssShmem
    crash                  {rank 0, after_s 0, signal "SIGKILL"|9 | exit_code N}: the rank kills
                           itself with the signal, or logs "Scheduler hit an exception", sends
                           SIGQUIT to the main process and exits N; either way the main
                           process runs the crash path (below)
    zombie                 {rank 0, after_s 0}: the rank exits 0 and the main process never
                           reaps it (state Z); /health then answers 503 (the rank is silent)
    hang                   {rank 0, after_s 0}: the rank SIGSTOPs itself (state T); /health 503
    health_fail_after_s    -     once up this long, /health and /health_generate fail ...
    health_fail_mode       "503" ... with 503, or "no_answer" (the request never answers)
    ignore_sigterm         false the main process ignores SIGTERM and SIGINT (only KILL works)
    orphan                 {kind "setsid"|"double_fork", holds_gpu false, rank 0, after_s 0,
                            lifetime_s 20, gpu_bytes 1 GiB, title "sglang::tokenizer_worker:{pid}"}:
                           the rank starts a process outside the server's process group
                           (setsid: a child in a new session; double_fork: reparented at once);
                           it holds GPU memory on the rank's GPU when holds_gpu, has no
                           PDEATHSIG, and exits by itself after lifetime_s
    gpu_release_delay_s    0     GPU memory of a dead rank stays used (PID still listed) this long
    gpu_stuck              false GPU memory of a dead rank is never released, until fake_gpu_reset
    exit_code_on_start     -     rank 0 dies with this code half-way through startup_s; the main
                                 process logs "Rank 0 scheduler died during initialization
                                 (exit code: N)", kills the tree and exits N
    bad_flags              []    flags rejected like argparse: exit 2 before anything starts
    hang_nvml_s            -     written to the state dir: every fake_nvml call blocks this long

Processes (SGLang's model, docs/sglang.md §3): the main process (title unchanged) serves HTTP and
spawns, with multiprocessing "spawn", one scheduler per local rank titled
sglang::scheduler[_DP{d}][_PP{p}][_TP{t}][_EP{e}] (plain sglang::scheduler for tp=1, no DP/PP/EP)
and sglang::detokenizer (plus multiprocessing's resource tracker). No setsid: all share the
launcher's process group. Children set PR_SET_PDEATHSIG=SIGKILL and exit if the parent died
before that; they ignore SIGTERM/SIGINT (the main process takes them down). Each rank on
"load" registers GPU memory (static pool: total × mem_fraction_static) on GPU
base_gpu_id + rank × gpu_id_step, holds runtime_gb as RssAnon and, with
--enable-hierarchical-cache, its host pool as touched MAP_SHARED|MAP_ANONYMOUS (RssShmem),
sized by supervisor/testing/sizing.py, a transcription of SGLang's own sizing code kept apart
from the pre-flight's (size, ratio and default-ratio modes; SGLang's auto-sizing is not
simulated: auto uses the default ratio). A --model-path without a readable config.json uses
Llama-3-70B geometry (80 layers, 8 KV heads, head_dim 128, bf16).

Not simulated: the DP controller process (with plain --dp-size the schedulers are children of
the main process here), tokenizer workers, real requests, SGLang's HiCache auto-sizing.

HTTP (after all ranks loaded; connection refused before): /health, /health_generate (503 while
starting or draining, 200 when every rank answers), /ready, /model_info, /server_info (with
max_total_num_tokens), /v1/models, /metrics (sglang:* names, only with --enable-metrics; 404
otherwise), POST /generate (toy). --api-key guards all but /health*, /ready and /metrics.

Exit codes of the main process
    0     SIGTERM/SIGINT: 503, drain_s, children told to exit (SIGKILL after 5 s), exit 0
    2     bad_flags hit, an argv the parser rejects, no --model-path, a bad scenario or a
          FAKE_SGLANG_BYTES_PER_GB that is not a byte count
    1     a rank died during load (exit_code_on_start: that code instead); port already in
          use; setproctitle not installed (pip install 'sglang-supervisor[testing]')
    -9    crash path: a rank exited non-zero (seen within 0.05 s) or sent SIGQUIT: HTTP frozen
          for crash_dump_wait_s, every descendant SIGKILLed, then the main process itself

Log lines (stderr, one flush per line, "[YYYY-mm-dd HH:MM:SS( TP0)] ..."):
    server_args=ServerArgs(model_path=..., tp_size=..., ...)
    Load weight begin. avail mem=X GB            (per rank)
    Load weight end. type=..., dtype=...         (per rank)
    KV Cache is allocated. dtype: ..., #tokens: N, K size: X GB, V size: Y GB
    Allocating MHA|MLA|DSA hierarchical KV host pool: N tokens, X GB host memory.
    Uvicorn running on http://HOST:PORT (Press CTRL+C to quit)
    Start of prefill warmup ...
    The server is fired up and ready to roll!
    Scheduler hit an exception: ...              (crash with exit_code, exit_code_on_start)
    Subprocess scheduler_I (pid=P) crashed with exit code N
    Received sigquit from a child process. It usually means the child failed.
    Rank I scheduler died during initialization (exit code: N)
    Received SIGTERM. Gracefully exiting... Remaining number of requests 0
    [Errno 98] error while attempting to bind on address ('HOST', PORT): address already in use

Simulated GPUs (FAKE_GPU_STATE_DIR; details in gpu_state.py): gpus.json lists N GPUs (index,
uuid, name, total_bytes, numa_node, baseline_used_bytes); holders/gpu<I>-pid<P>.json, one file
per holding process, written atomically; nvml.json {"hang_s"}. A holder counts while its PID is
alive and not a zombie; after it dies its memory stays used (PID listed) for
gpu_release_delay_s, then is released, or with gpu_stuck stays used with no PID listed until
`python -m supervisor.testing.fake_gpu_reset INDEX|UUID`, which refuses (exit 255, nvidia-smi's
message) while a live process holds that GPU. Read them through supervisor.testing.fake_nvml
(pynvml-shaped), e.g. supervisor.preflight.sensors.open_sensor("sim").
"""
