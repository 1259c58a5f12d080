"""`sglang-supervisor preflight` (placeholder until the pre-flight lands)."""

from __future__ import annotations

import click


@click.command()
def preflight() -> None:
    """Check that an SGLang launch fits the host before starting it."""
