"""Editing Inductor's FX graph, for emitters and passes alike: the node builder (`builder.Emitter`), traced
Triton ops inlined as kernel calls (`triton_inline`) with their access analysis cached
(`triton_access_cache`), fallback ops decomposed into aten (`decompose`), and the fixes qlower applies to
Inductor's own lowerings (`inductor_fixes`). No record, no device: `emit/` turns records into nodes with these.
"""
