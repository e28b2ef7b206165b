"""How the system runs: the local all-in-one launcher, the dev broker, benchmarks."""
