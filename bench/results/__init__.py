"""What was measured, stored and compared: result files (store, with the environment from env and the
`bench verify` records of verifications), base-vs-head comparison, the analysis behind charts and reports,
and the terminal tables."""
