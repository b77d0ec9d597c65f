import os

if os.environ.get("TUNER_BENCH_ISA"):     # before any peer reads the CPU (bench/isa.py)
    from bench.isa import emulate
    emulate(os.environ["TUNER_BENCH_ISA"])
