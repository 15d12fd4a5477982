"""How cases reach ranks: the checks against this host before any rank starts (preflight, with the memory
estimate), starting local ranks (local: the forkserver they fork from, the loopback rendezvous,
run_on_ranks; lifeline: they die with the launcher; devices: the launcher's probe of the accelerators), pools
of local ranks that run many cases each (pool, pool_rank; stuck names a stuck rank), the local and torchrun
launchers, the shuffled rounds (schedule) and running them (sweep), base/head code from git refs
interleaved round by round (gitrefs, interleave), and a user's backends in every one of these processes
(user_backends)."""
