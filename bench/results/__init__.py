"""The result file: one JSON file per run (store), with its environment (env), the `bench verify` records
(verifications), the format's history and conversions (migrate), its JSON Schema (schema), rows for pandas
(export), names that never overwrite (paths), short names of runs, latest and latest~N (names), the guard of
what a command writes where it is told to (outputs), one run at a time on a file (lock), and many commits'
files read for a history (history). How results are judged lives in bench.judge; how they print, in
bench.render."""
