"""Group mode: one node of a multi-node SGLang group (docs/multi-node.md) — the leader's board
of reports and its endpoints, a worker's report loop, the wait for the leader's address, the
launch gate opener, and the /healthz and /readyz probes every run with a listener serves."""
