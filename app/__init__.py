"""inferlab's application layer: CLI, desktop window, engine host thread, benchmarks."""
