"""qlower's test suite, a package: its model forms (`tests.forms`) and helpers (`tests.helpers`) import by
those names, here and in scripts/ (pytest puts the repository root on the import path: pyproject.toml)."""
