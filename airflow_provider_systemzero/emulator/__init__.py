"""A local System Zero stream gateway for development, tests and benchmarks."""
