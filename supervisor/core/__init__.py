"""Pure decisions: readings in, decisions out. No I/O, clock, processes or logging here."""
