"""``iomatrix effect`` and ``iomatrix scores``: what one axis changes, and a composite score."""
