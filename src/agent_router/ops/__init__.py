"""Operating a team: the CLI, the demo, the chaos run, the benchmarks, the guarantee checks."""
