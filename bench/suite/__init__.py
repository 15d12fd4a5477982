"""What to run: the suite file and scenarios as dataclasses (config), their reading and `--set` overrides
(loader), pass bars (thresholds), `--filter` (filters), and command-line words to cases (selection)."""
