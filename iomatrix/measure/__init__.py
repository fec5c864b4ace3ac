"""Measuring a suite: the runner, the trial loop, steady-state watches and the host checks
that come first (doctor)."""
