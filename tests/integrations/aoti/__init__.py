"""AOTInductor: exported packages, qlower's C shims, packages that run without qlower."""
