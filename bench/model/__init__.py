"""The cost model: predicted step time and peak memory per CP mode at any cp, sequence and layer.

    links.py      the alpha-beta interconnect (latency + bytes / bandwidth per collective kind), its file
    calibrate.py  the micro-benchmark that measures it on this host's backend
    predict.py    compute fitted to measured cp 1 cases, communication on each mode's critical path,
                  memory from the preflight estimate; predictions checked against measured runs

The command is `bench model` (bench/commands/model.py). What a mode contributes (its critical path, the
compute its exchange adds) is declared by the mode class in gdn_cp.distributed.modes.
"""
