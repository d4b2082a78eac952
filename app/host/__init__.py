"""The embedded engine source: EngineHost runs the engine loop in its own thread (queued Qt signals for
load progress), its typed commands (host_commands), the measurement work it runs between steps
(engine_work) and the multi-LoRA pool's commands (lora_host). A server inferlab starts is a source of its
own: app/managed/."""
