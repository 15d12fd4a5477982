"""What a rank measures: the rank function of `bench run` (rank), timing statistics over ranks and repeats
(timing), and peak memory (memory)."""
