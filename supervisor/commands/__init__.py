"""Click commands: each parses its options and calls a plain function of the shell."""
