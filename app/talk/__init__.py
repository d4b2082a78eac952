"""The talk: presets (one per chapter), their scripted cues, the knobs' defaults, and each chapter's measured
comparison (compare/: spec, seeded workload, runner, store; compare_run runs one from the app;
`inferlab prepare` measures them ahead)."""
