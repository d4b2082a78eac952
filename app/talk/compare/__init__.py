"""Measured comparisons per chapter: the same seeded workload under two or more configurations, each on
its own engine (never the live one), results stored per machine, model and configuration."""
