"""sglang-supervisor: pre-flight, process supervision and memory/GPU watchdog for SGLang."""

__version__ = "0.1.0"
