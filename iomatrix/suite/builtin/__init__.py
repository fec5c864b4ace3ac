"""Built-in suites, as TOML data files (``iomatrix suites`` lists them)."""
