"""Seeded traffic: the load generator (open loop: Poisson arrivals, bursts; closed loop: N clients) and the
benchmarks' workloads (a fixed corpus, mixed chats and documents)."""
