"""``iomatrix compare RUN_A RUN_B``: the same points across two runs."""
