"""How the system runs: the local all-in-one launcher, its Kafka node, benchmarks."""
