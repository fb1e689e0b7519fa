"""The emitters and graph editing: how a record becomes graph nodes (scales, traced Triton calls, host
branches)."""
