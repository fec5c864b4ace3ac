"""Analysis of stored runs (pure): points from samples; later statistics, gains, scores."""
