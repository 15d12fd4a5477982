"""The result file: one JSON file per run (store), with its environment (env), the `bench verify` records
(verifications), the format's history and conversions (migrate), its JSON Schema (schema), rows for
pandas (export) and names that never overwrite (paths). How results are judged lives in bench.judge; how
they print, in bench.render."""
