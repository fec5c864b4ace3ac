"""Measuring a suite: the run prepared once (prepare: what ``run --plan`` prints), the runner,
the trial loop, steady-state watches and reclaiming what killed runs left."""
