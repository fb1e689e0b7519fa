"""Tests of lowerings/, in four parts: the registry, the device rules, the emitters and graph editing, the
kernels."""
