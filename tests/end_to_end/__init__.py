"""Full torch.compile runs through qlower's pass: each family on each device, compile modes, dynamic shapes,
epilogues, training graphs, the pass under Inductor's caches, the report."""
