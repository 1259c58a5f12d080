"""Simulated SGLang server and simulated GPUs: the test bed the supervisor is tested against.

Shipped with the product (the `demo` and a GPU-less systemd trial use it) but imported by the
product only when the GPU backend `sim` is chosen. Imitates SGLang 0.5.23, written from its source
(each module cites the files and functions it follows); docs/sglang.md summarises the facts.

Launch (exactly SGLang's argv after the module):
    python -m supervisor.testing.fake_sglang --model-path M [launch_server flags ...]
Topology and sizing flags are read with argparse as SGLang reads them (supervisor/testing/args.py,
independent of the supervisor's own reader); other flags are accepted and ignored, as long as
they are not in the scenario's `bad_flags`.

Environment variables
    FAKE_SGLANG_SCENARIO      JSON object of scenario keys (below); unset/empty = happy path.
    FAKE_SGLANG_BYTES_PER_GB  real bytes allocated per simulated GB (1e9 B); default 1048576
                              (1 MiB per GB). A 50 GB host pool at the default is 50 MiB.
    FAKE_GPU_STATE_DIR        simulated GPUs (format below); unset = no GPU registration; a
                              directory without gpus.json: exit 2 before anything starts
    FAKE_SGLANG_SHM_RECORD    a file each simulated process appends its /dev/shm segment names
                              to, before creating them (test bookkeeping; unset = none)
    SGLANG_USE_MESSAGE_QUEUE_BROADCASTER  false/0/no/n: no broadcaster segments (as SGLang)
    FAKE_SGLANG_MARKER        not read by the fake: every simulated process keeps its inherited
                              environment readable in /proc/PID/environ (SPT_NOENV=1), so the
                              test suite's leak guard finds them by this marker.
    SPT_NOENV                 set to 1 by the children before setproctitle (see above).

Scenario keys (FAKE_SGLANG_SCENARIO; seconds `_s`, bytes `_bytes`, "GB" scaled as above;
`after_s` counts from the end of that rank's load; unknown keys or wrong types exit 2)
    startup_s              0.2   load time per rank: the port refuses connections meanwhile
    warmup_s               0.1   after binding: /health and /ready 503 ("Starting") until the
                                 warmup request is done, then 200
    warmup_tries           120   a port it cannot bind: "[Errno 98] … address already in use",
                                 then SGLang's warm-up still asks whatever holds the port for
                                 /model_info (this many times, 1 s apart, 5 s each) and POSTs a
                                 /generate: "The server is fired up and ready to roll!" if that
                                 answers (else "Initialization failed. warmup error" and the
                                 tree killed, -9), then exit 3 (supervisor/testing/warmup.py)
    request_s              0     how long a POST /generate takes (counted in flight meanwhile)
    drain_poll_s           0.05  SIGTERM: the drain looks at the requests in flight this often
                                 (sigterm_watchdog: 5 s in SGLang)
    scheduler_exit_timeout_s 15  after the drain, how long the schedulers get to leave on the
                                 ShutdownReq before they are killed (15 s in SGLang)
    crash_dump_wait_s      0.2   crash dump (running-phase SIGQUIT, or SIGTERM after a failed
                                 health check): HTTP frozen this long (SGLang: 5 s + py-spy +
                                 60 s coredump wait ≈ 65 s); none when both
                                 SGLANG_PYSPY_DUMP_BEFORE_CRASH and
                                 SGLANG_CUDA_COREDUMP_BEFORE_CRASH are off (0/false)
    health_check_timeout_s 2.0   /health waits this long for every rank to answer a ping
                                 (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s in SGLang)
    health_delay_s         1.0   /health looks at its one-token generation only after this
                                 long, and again each health_delay_s (SGLang's handler sleeps
                                 1 s per look): a 200 takes at least this long; each /health
                                 logs rank 0's "Prefill batch, #new-seq: 1, #new-token: 1, …"
                                 (tests/testing/support.py sets 0 unless a test asks)
    runtime_gb             4.0   private anonymous memory per rank (torch/CUDA/NCCL runtime)
    gpu_total_bytes        -     GPU size for sizing when no state dir (default H200, 143771 MiB)
    weight_bytes_per_rank  20 GiB  weights each rank puts on its GPU
    cuda_context_bytes     0     GPU memory a rank takes before SGLang measures free memory
    max_total_num_tokens   -     device KV tokens per rank (default: sized as SGLang sizes it)
    leak                   {rank 0, bytes_per_s 1 MiB, after_s 0, max_bytes 32 MiB,
                            kind "anon"|"shmem"}: real bytes (not scaled), touched, growing
                           until max_bytes; anon shows as RssAnon, shmem as RssShmem
    crash                  {rank 0, after_s 0, signal "SIGKILL"|9 | exit_code N}: the rank kills
                           itself with the signal, or logs "Scheduler hit an exception", sends
                           SIGQUIT to its parent and exits N (SGLang's own scheduler exits 0
                           there). A scheduler's parent is the main process, or the DP
                           controller with plain --dp-size, which that SIGQUIT kills (-3)
    zombie                 {rank 0, after_s 0}: the rank exits 0 and its parent never reaps it
                           (state Z); /health then answers 503 (the rank is silent)
    hang                   {rank 0, after_s 0}: the rank SIGSTOPs itself (state T); /health 503
    health_fail_after_s    -     once up this long, /health and /health_generate fail ...
    health_fail_mode       "503" ... with 503 (the server turns UnHealthy), or "no_answer"
                                 (the request never answers)
    ignore_sigterm         false the main process ignores SIGTERM and SIGINT (only KILL works)
    orphan                 {kind "setsid"|"double_fork", holds_gpu false, rank 0, after_s 0,
                            lifetime_s 20, gpu_bytes 1 GiB, title "sglang::tokenizer_worker:{pid}"}:
                           the rank starts a process outside the server's process group
                           (setsid: a child in a new session; double_fork: reparented at once);
                           it holds GPU memory on the rank's GPU when holds_gpu, has no
                           PDEATHSIG, and exits by itself after lifetime_s
    gpu_release_delay_s    0     GPU memory of a dead rank stays used (PID still listed) this long
    gpu_stuck              false GPU memory of a dead rank is never released, until a reset
    exit_code_on_start     -     rank 0 exits with this code half-way through startup_s, outside
                                 Python's handlers (no SIGQUIT); the main process raises
                                 "RuntimeError: Rank 0 scheduler died during initialization
                                 (exit code: N). …", kills the tree and exits 1
    bad_flags              []    flags rejected like argparse: exit 2 before anything starts
    hang_nvml_s            -     written to the state dir: every fake_nvml call blocks this long
    shm_segments           -     /dev/shm ring buffers: unset = SGLang's (below); N = rank 0
                                 makes N (whatever the topology) and no other rank any; 0 = none
    shm_sweep              false before anything starts, the main process runs SGLang's stale
                                 /dev/shm sweep (below); SGLang 0.5.23's server never does
    log_lines              []    lines the main process prints after its server_args line, with
                                 $NAME expanded from its environment: what a library's debug
                                 output may reveal (a token, an Authorization header)
    weight_shards          8     checkpoint files "loaded" over startup_s: the first rank of node 0
                                 draws SGLang's shard meter (tqdm, "\r" redraws; progress_bar.py)
    gpu_fault              {rank 0, after_s 0, kind "xid", code -, value -}: the rank puts a
                           fault on its simulated GPU, as `fake_gpu inject KIND VALUE` does
                           (kind a FAULT of `inject --help`; code the Xid for "xid", value the
                           ACTION / NAME for "recovery-action" / "unsupported"), and carries on
    dist_timeout_s         60    rendezvous timeout (below; --dist-timeout N wins, as in SGLang)
    nccl_timeout_s         1.0   a rank whose communicator broke hangs after this long (below)
    init_fork_s            0.013 as it initialises, right after setproctitle, every scheduler forks
                                 a child that keeps the scheduler's title (and pid as its parent)
                                 this long, exits 0 and is reaped at once (SGLang runs lscpu or
                                 nvidia-smi there: ~13 ms before the exec); null: no child
    output_flood           {after_s 0, line_bytes 1 MiB, word_chars 200000, cjk_chars 8000,
                            every_s 0.25, rounds -}: from after_s on, the main process prints,
                           round after round (every_s apart; rounds unset: until it ends), a
                           line of line_bytes of 1,000-character words (a client's prompt under
                           --log-requests), one word of word_chars characters, and cjk_chars of
                           CJK text, none with a space inside (supervisor/testing/flood.py)

Processes (SGLang 0.5.23; supervisor/testing/topology.py): the main process (title unchanged)
serves HTTP; every child is a multiprocessing "spawn" child; nobody calls setsid, so all share
the launcher's process group. With num_dp_ranks = dp_size × attn_dp_size > 1 there is a
sglang::data_parallel_controller, a child of the main process: with plain --dp-size it spawns
each DP group's schedulers itself ("Launch DP{d} starting at GPU #{offset}."); with attention DP
(--attn-dp-size, or the deprecated --dp-size N --enable-dp-attention) the main process starts
the schedulers and the controller. Schedulers are titled sglang::scheduler plus, in this order
and each only when its width is > 1, _DP{d} (only with a DP controller), _PP{p},
_ATTN_CP{c} (--attn-cp-size), _MOE_DP{m} (--moe-dp-size), _TP{t}, _EP{e} (ranks derived as
runtime_context.py derives them); their log prefix is the same with spaces ("[… DP0 TP1]").
Then, on node_rank 0 only: sglang::detokenizer, or with --detokenizer-worker-num N > 1 N of
them and a sglang::detokenizer_router. With --tokenizer-worker-num N > 1, N uvicorn workers
titled sglang::tokenizer_worker:{pid}, children of the main process, without PDEATHSIG (they
outlive a killed main process and keep the listening socket bound), replaced when one dies; the
arguments go to shared memory /dev/shm/multi_tokenizer_args_{main pid} (unlinked on a clean
stop, left behind by a SIGKILL). Plus multiprocessing's resource tracker. Schedulers,
detokenizers, router and controller set PR_SET_PDEATHSIG=SIGKILL and exit if the parent died
before that; no child installs a SIGTERM or SIGINT handler: SIGTERM kills it (-15), SIGINT
raises KeyboardInterrupt (exit 1, traceback); tokenizer workers take SIGTERM (below). GPU of a
rank: base_gpu_id + DP group offset (d × tp × pp × gpu_id_step, plain DP) +
(pp_rank % pp_per_node) × tp_per_node + (tp_rank % tp_per_node) × gpu_id_step. Each rank
registers on its simulated GPU, stage by stage: cuda_context_bytes, + weight_bytes_per_rank
after the load, + its KV pool (K and V, or KV, each with the padded page). It holds runtime_gb
as RssAnon and, with --enable-hierarchical-cache, its host pool (DSA: + the indexer's) as
touched MAP_SHARED|MAP_ANONYMOUS (RssShmem), sized by supervisor/testing/sizing.py, a
transcription of SGLang's sizing code kept apart from the pre-flight's (size, ratio and
default-ratio modes; SGLang's auto-sizing is not simulated: auto uses the default ratio). A
hybrid model (GPT-OSS and Llama-4: a full and a sliding-window pool; Qwen3-Next and Nemotron-H:
a Mamba state pool beside the attention layers' KV) is sized pool by pool by
supervisor/testing/hybrid.py: the budget split as SGLang splits it (SWA 0.8 × full,
--swa-full-tokens-ratio; Mamba 0.9/1.9 of the budget, --mamba-full-memory-ratio,
--max-mamba-cache-size), one "KV Cache is allocated" line per pool in SGLang's order ("Full"
then "SWA" and the SWAKVPool total; "Mamba Cache is allocated" before the KV pool's), and a
host pool per pool (--hicache-size split by device bytes; "Allocating full/swa/kv hierarchical
KV host pool", "… hierarchical Mamba cache (N state slots, …)"). A --model-path without a
readable config.json uses Llama-3-70B geometry (80 layers, 8 KV heads, head_dim 128, bf16).

Multi-node (supervisor/testing/rendezvous.py, gate.py; --nnodes N --node-rank R
--dist-init-addr HOST:PORT (alias --nccl-init-addr) [--gated-launch-port P]): the ranks form one
torch world; world rank = node_rank × ranks per node + local index (topology.py's placement,
tp_size × pp_rank + tp_rank as SGLang counts it). Before its broadcasters and its load every
rank joins it: world rank 0 (node 0's first rank) listens on HOST:PORT (torch's TCPStore
master; the only port SGLang's multi-node derivations make the simulation bind), every rank
connects (retrying while nothing listens) and says its rank; once all joined the master says
"go". On dist_timeout_s the rank raises like torch and fails as a scheduler does ("Scheduler hit
an exception: Traceback …" with "torch.distributed.DistNetworkError: The client socket has
timed out after Nms while trying to connect to (HOST, PORT).", "torch.distributed.DistStoreError:
Timed out after N seconds waiting for clients. J/W clients joined.", "…DistNetworkError: Failed
to recv, got 0 bytes. …" once the master gave up, "…The server socket has failed to listen on
any local network address. …" when the port is taken, or NetworkAddress.parse's ValueError for
a bad address), SIGQUIT to its parent: the main process dies as at any launch-phase SIGQUIT (-9).
The connections stay open as the communicator: rank 0's ShutdownReq (a clean stop of node 0)
reaches every rank, which exits 0, so worker nodes then exit 0; when a rank's connection breaks
(it died, or node 0's rank 0 did) every survivor, after nccl_timeout_s, hangs: it stops
answering its main process (node 0's /health fails as the health check times out; a worker
node's dummy health still says 200), never exits by itself (real NCCL's watchdog may abort much
later), and dies on SIGKILL or with its parent. The gate (sglang/srt/distributed/gated_launch.py):
after the rendezvous, before "Load weight begin", every rank logs "Gated launch waiting for
activation. rank=N" (and "Gated launch still waiting for activation. rank=N elapsed=X s" every
10 s); world rank 0 serves GET /health -> "OK" and POST /gate/activate -> "OK" on (--host, P)
("Gated launch control server started on H:P"; never stopped) and polls it every second; the
activation reaches every rank over the communicator; each logs "Gated launch activated.
elapsed=X.XX s" and loads, answering its main process all along. Without --dist-init-addr
there is no rendezvous (a worker node started alone comes up by itself), except that a gate
makes the node's own ranks a world of their own at --host:<a free port>, as SGLang's nccl_port.

Not simulated: SGLang's HiCache auto-sizing; real generation (a request just takes request_s);
uvicorn's HTTP inside the tokenizer workers (the main process serves HTTP, the workers only
stand for the process tree); uvicorn's access log; SIGHUP/SIGTTIN/SIGTTOU in multi-tokenizer
mode (taken and ignored); a warmup that fails by itself.

HTTP (after all ranks loaded; connection refused before): /health and /health_generate (503
while Starting; while shutting down 503 with "Health check request received during shutdown.
Returning 503."; otherwise every rank must answer a ping: 200 and Up, or "Health check
failed. …", 503 and UnHealthy), /ready (200 only when Up and not shutting down), /model_info,
/server_info (with max_total_num_tokens), /v1/models, /metrics (sglang:* names, with
num_running_reqs = requests in flight; only with --enable-metrics, 404 otherwise), POST
/generate (served in every state, draining included; counted in flight for request_s).
--api-key guards all but /health*, /ready and /metrics. Worker nodes (node_rank >= 1) run
SGLang's dummy health server instead: /health, /health_generate, /ping always 200, /metrics
with --enable-metrics, 404 for anything else.

Signals and exit codes of the main process (supervisor/testing/stopping.py)
    SIGQUIT  launch phase (until the first generate request: the warmup's, a /health's or a
             client's): "Received sigquit from a child process. It usually means the child
             failed.", tree killed at once, -9. Running phase: "SIGQUIT received. signum=None,
             frame=None. It usually means one child failed.", watchdog stopped, crash dump
             (crash_dump_wait_s, HTTP frozen), tree killed, -9. With tokenizer workers uvicorn
             owns SIGQUIT: it is swallowed and the server keeps running.
    SIGTERM  while loading: default action, -15 (children follow by PDEATHSIG). Node 0 before
             the first generate request (uvicorn's handler): "INFO:     Shutting down", requests
             in flight finish, "Finished server process [P]", then -15; during the warmup the
             warmup fails instead ("Initialization failed. warmup error: …", tree killed, -9;
             SGLang may retry /model_info for 2 minutes first). Node 0 afterwards
             (tokenizer_manager.py SignalHandler): "SIGTERM received. signum=None frame=None.
             Draining requests and shutting down...", HTTP as above, every drain_poll_s
             "Gracefully exiting... Remaining number of requests N. Remaining requests
             remaining_rids=[...]." until N is 0 (UnHealthy: "Signal SIGTERM received while
             health check failed. Force exiting." and a crash dump instead; SGL_FORCE_SHUTDOWN:
             "Signal SIGTERM received while force shutdown flag set. Force exiting."), then the
             watchdog stops, the schedulers get a ShutdownReq and exit 0 (after
             scheduler_exit_timeout_s: "Schedulers still alive Ts after ShutdownReq, killing
             them before they released: [pids]"), the rest is killed, uvicorn shuts down: 0.
             With tokenizer workers: "INFO:     Received SIGTERM, exiting.", SIGTERM to each
             worker ("Terminated child process [P]"; each drains and exits 0), requests in
             flight finish, ShutdownReq, "Stopping parent process [P]", shm unlinked: 0.
             Node >= 1 (entrypoints/engine.py): "SIGTERM received on node_rank N; waiting for
             the rank-0 ShutdownReq broadcast to stop the schedulers." and nothing else; the
             dummy health server keeps answering 200; the main process exits 0 once every
             scheduler has exited ("Scheduler or DataParallelController P terminated with N").
    SIGINT   while loading, and on node >= 1: KeyboardInterrupt, children killed, -2. Node 0:
             uvicorn's graceful shutdown as for SIGTERM (warmup failure included), then
             KeyboardInterrupt, children killed, -2. With tokenizer workers: as SIGTERM,
             "Received SIGINT, exiting.".
    0        a clean stop (above)
    1        a rank died during load ("RuntimeError: Rank I scheduler died during
             initialization (exit code: N). …"); setproctitle not installed
    2        bad_flags hit, an argv the parser rejects, no --model-path, a bad scenario, a
             FAKE_SGLANG_BYTES_PER_GB that is not a byte count, or a FAKE_GPU_STATE_DIR without
             gpus.json ("fake_sglang: FAKE_GPU_STATE_DIR: simulated GPU state dir D holds no
             gpus.json; create simulated GPUs with `python -m supervisor.testing.fake_gpu
             create 8 --dir D`")
    3        the port is taken (uvicorn's STARTUP_FAILURE; SGLang with its warmup on instead
             retries /model_info for 2 minutes and kills itself, -9)
    -9, -15, -2  as above
SubprocessWatchdog (utils/watchdog.py): from the end of the load, a child (scheduler_I in
SGLang's list, the DP controller being scheduler_0; detokenizer, detokenizer_I,
detokenizer_router) found dead with a non-zero code (-15 and -9 included) gives "Subprocess
NAME (pid=P) crashed with exit code N. Triggering SIGQUIT for cleanup..." and a SIGQUIT to the
main process; the watchdog then stops. None on worker nodes (but process_I with attention DP).

Log lines (stderr, one flush per line; SGLang's "[YYYY-mm-dd HH:MM:SS{prefix}] ...", uvicorn's
"[YYYY-mm-dd HH:MM:SS] INFO:     ..."):
    server_args={'model_path': ..., 'tp_size': ..., ..., 'api_key': ...}   (in clear, as SGLang)
    Launch DP{d} starting at GPU #{offset}.                (plain DP, the controller)
    Load weight begin. avail mem=X.XX GB                   (per rank; GB = 2**30)
    \rLoading safetensors checkpoint shards:  50% Completed | 4/8 [00:00<00:00,  9.91it/s]
                                                           (rank 0 of node 0: tqdm redraws,
                                                           "\n" at the end; none when 0 shards)
    Load weight end. elapsed=X.XX s, type=Arch, [quant=..., ]avail mem=X.XX GB, mem usage=Y.YY GB.
    KV Cache is allocated. dtype: torch.bfloat16, #tokens: N, K size: X.XX GB, V size: Y.YY GB
    KV Cache is allocated. dtype: ..., #tokens: N, KV size: X.XX GB      (MLA, DSA)
    Memory pool end. avail mem=X.XX GB
    HiCache kv host pool (N tokens) is smaller than the device pool (M tokens);L2 cache ...
    Allocating kv hierarchical KV host pool: N tokens, X.XX GB host memory.   (GB = 1e9)
    Allocating X.XX GB host memory for DSA indexer (layout=page_first).
    INFO:     Started server process [P] / Waiting for application startup. / Application
              startup complete. / Uvicorn running on http://HOST:PORT (Press CTRL+C to quit)
    The server is fired up and ready to roll!
    Scheduler hit an exception: ...                        (crash with exit_code)
    DataParallelController hit an exception: ...           (a rank died before it was ready)
    kill_process_tree called: parent_pid=P, include_parent=True|False, pid=P
    ERROR:    [Errno 98] error while attempting to bind on address ('HOST', PORT): address
              already in use
    and the stop and crash lines above.

Shared memory (supervisor/testing/shm.py): SGLang's segments, in /dev/shm, named as
utils/stale_shm_cleanup.py `make_shm_name` names them: sgl_shm_<kind>_<pid>_<8 hex>, pid the
creating process. Each scheduler that writes a broadcaster group (the first rank of TP, and of
attention TP / attention CP when narrower than TP; shm_broadcast.py `MessageQueue`) makes, as its
load begins, sgl_shm_nodecheck_* (128 bytes, unlinked at once) and, when a reader of the group is
on its node, sgl_shm_mq_* ((4 MiB + 1 + readers) × 6 bytes, scaled like every "GB": ~26 KiB at
the default scale). With tokenizer workers the main process adds multi_tokenizer_args_{pid}
(above). A ShutdownReq (clean stop) unlinks them; a SIGKILL of the tree (kill_process_tree, a
process group, a cgroup) leaks them. They are SharedMemory segments, so multiprocessing's resource
tracker, a child of the main process, unlinks the leftovers once every process holding it has
exited, when it is not killed itself: a SIGKILL to the main process alone, or SIGTERM while
loading, loses nothing ("resource_tracker: There appear to be N leaked shared_memory objects").
Two files carry no PID: the load snapshot sglang_loads_<instance id>_<blake2s>.shm, made and
mapped by the first scheduler of each attention group at PP stage 0 (12 B + 16 KiB per DP rank),
never unlinked, not even at a clean stop; and tqdm's write lock, a multiprocessing semaphore
sem.mp-<8 chars> made by the rank that draws the loading bar, unlinked at its clean exit (or by
the resource tracker), leaked by a SIGKILL of the tree.
Stale sweep (stale_shm_cleanup.py `cleanup_stale_shm`, run by SGLang's CI, not by its server):
a file whose name carries a creator PID (sgl_shm_*: the second-to-last "_" field;
multi_tokenizer_args_*: the last) is unlinked when that PID is not the sweeper's and os.kill(PID,
0) fails with ESRCH (a zombie or a recycled PID counts as alive), logging "cleanup_stale_shm:
removed N stale segment(s), freed X.X MiB". SGLang also unlinks pid-less families (sglang_loads_*,
cuda.shm.*, nccl-*, sem.loky-*) unconditionally; the simulation leaves them to their owners.

Simulated GPUs (FAKE_GPU_STATE_DIR; details in gpu_state.py): gpus.json lists N GPUs (index,
uuid, name, total_bytes, numa_node, baseline_used_bytes, nvlink_group, per_gpu_reset, nvswitch);
holders/gpu<I>-pid<P>.json, one file per holding process, written atomically; nvml.json
{"hang_s"}; health/gpu<I>.json, a GPU's faults (gpu_faults.py); events.jsonl, the driver's
event queue (gpu_events.py). A holder counts while its PID is alive and not a zombie; after it
dies its memory stays used (PID listed) for gpu_release_delay_s, then is released, or with
gpu_stuck stays used with no PID listed until `python -m supervisor.testing.fake_gpu reset
INDEX|UUID` (alias: `python -m supervisor.testing.fake_gpu_reset INDEX|UUID`), which refuses
(nvidia-smi's messages) while a live process holds one of the GPUs (exit 255), for a lost GPU
(15), or when NVLink peers without per-GPU reset are not all named (255). Read them through
supervisor.testing.fake_nvml (pynvml-shaped: memory and processes, health, ECC, fabric,
recovery action, events, NVLink P2P; a lost or reset-needing GPU raises GPU_IS_LOST /
RESET_REQUIRED, an `unsupported` call NOT_SUPPORTED), e.g.
supervisor.preflight.sensors.open_sensor("sim"); with no usable state dir it raises pynvml's
NVMLError_DriverNotLoaded, its message saying what is wrong and how to fix it. One command for
them (supervisor/testing/fake_gpu.py; DIR defaults to $FAKE_GPU_STATE_DIR; bad input exits 2):
    python -m supervisor.testing.fake_gpu create N [--dir DIR] [--total-bytes SIZE]
        [--numa-nodes K] [--name NAME]      N idle GPUs (default H200, 143771 MiB, one node)
        [--nvlink-peers K] [--reset-peers-together] [--nvswitch]     NVLink groups of K GPUs
    python -m supervisor.testing.fake_gpu reset INDEX|UUID[,...] ... [--dir DIR]
                                                                     (exit 0, 6, 9, 15, 255)
    python -m supervisor.testing.fake_gpu list [--dir DIR] [--json]  GPUs, holders, faults
    python -m supervisor.testing.fake_gpu inject FAULT [VALUE] [GPU] [--gpu INDEX] [--dir DIR]
        e.g. `inject xid 79 --gpu 2` (an Xid event; 79 loses the GPU, 48 asks for a reset),
        `inject remap-pending 1`, `inject unsupported nvmlDeviceGetRemappedRows 1`,
        `inject clear 1`; `inject --help` lists every fault
"""
