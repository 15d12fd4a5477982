"""`bench doctor`'s checks of a host before a long sweep: the machine (system.py) and its devices on real
ranks (rank.py), each a Check (checks.py) with a status and one line of detail."""
