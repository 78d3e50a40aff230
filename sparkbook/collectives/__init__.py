"""02's all-reduce sweeps across the nodes and their judgement (bus bandwidth, latency)."""
