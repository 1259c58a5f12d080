"""`python -m supervisor` runs the CLI."""

from supervisor.cli import main

main()
