"""The pre-flight: plan a launch against this host's memory before anything starts."""

from supervisor.preflight.plan import parse_plan, run_preflight, suggested_argv

__all__ = ["parse_plan", "run_preflight", "suggested_argv"]
