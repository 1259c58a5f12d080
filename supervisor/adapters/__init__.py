"""Thin adapters from the outside world (procfs, cgroups, NVML, HTTP, systemd) to core values."""
