"""The pre-flight: plan a launch against this host's memory before anything starts."""

from supervisor.preflight.plan import run_preflight, suggested_argv
from supervisor.preflight.reader import launch_reader

__all__ = ["launch_reader", "run_preflight", "suggested_argv"]
