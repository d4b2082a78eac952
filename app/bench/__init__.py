"""Benchmarks: each one measures inferlab and its baseline side by side in one run."""
