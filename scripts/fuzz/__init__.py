"""The correctness fuzz's parts (fuzz_compile.py runs them): `case` (one drawn case), `draw` (the axes and
variants), `models` (what a case compiles), `steps` (its calls), `check` (its numbers), `run` (one case end to
end), and the defect classes that bring their own models and row checks, `classes` and `pipelines`.
"""
