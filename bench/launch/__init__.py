"""How cases reach ranks: the checks against this host before any rank starts (preflight, with the memory
estimate), the local and torchrun launchers, running cases one after another (sweep), and base/head code
from git refs interleaved case by case (gitrefs, interleave)."""
