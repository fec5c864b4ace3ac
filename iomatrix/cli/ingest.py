"""``iomatrix import DIR``: existing fio JSON results stored as a run."""
