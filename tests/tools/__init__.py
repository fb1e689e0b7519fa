"""The repository's tools and rules: layout and packaging, the scripts (benchmarks, fuzz), the CLI and the
demo, the commands the README and docs show."""
