"""Many runs: comparisons, recipes, tuning, budgets, step timing, statistics, verdicts,
figures."""
