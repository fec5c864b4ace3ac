"""Cluster nodes and the SSH that reaches them (issue 23): below the suite, which names nodes."""
