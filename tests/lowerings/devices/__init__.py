"""The device rules: which lowering each device takes (capabilities, crossovers) and its run-time settings."""
