"""Analysis of stored runs (pure): points from samples, statistics, gains, % of bare metal,
scores and comparisons between runs."""
