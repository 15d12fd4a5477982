"""How cases reach ranks: the checks against this host before any rank starts (preflight, with the memory
estimate), pools of local ranks that run many cases each (pool, pool_rank; stuck names a stuck rank), the
local and torchrun launchers, the shuffled rounds (schedule) and running them (sweep), and base/head code
from git refs interleaved round by round (gitrefs, interleave)."""
