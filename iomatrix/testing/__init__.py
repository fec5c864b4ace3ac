"""Support for tests and benchmarks: synthetic runs stored in a real database."""
