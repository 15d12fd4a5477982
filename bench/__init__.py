"""bench: sweeps, timing, memory, accuracy checks, comparisons and reports for gdn_cp's context
parallelism. Imports nothing: `bench.entry` checks the dependencies before anything needs them."""
