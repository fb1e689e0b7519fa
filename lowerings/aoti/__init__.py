"""AOTInductor support: C shims for the ops qlower's lowerings emit, their ABI lock, and their libraries."""
