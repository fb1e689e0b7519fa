"""The families bench.py benchmarks, one module each (`--family woq_int8|dynamic_int8|mx`), imported by name
when a run asks for it; the interface each follows is at the top of bench.py."""
