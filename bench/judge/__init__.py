"""How results are judged, apart from the files that hold them (bench.results): the head/base comparison
and its verdicts, change points across commits, the gate, a case's history, the series and ablations
charts and reports derive, the reference PR's tables as records, and the bytes a case moves. Pure: no
files written, no ranks launched, nothing printed."""
