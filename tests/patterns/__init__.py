"""Tests of the recognizers (patterns/, passes/canonicalize.py): each family's graph forms, special values,
the order of families, the QuantLinear record."""
