"""Reports: ``data`` builds a JSON-ready view model from a stored run; ``html`` only draws it;
``export`` writes the samples as CSV."""
