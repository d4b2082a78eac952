"""Multi-LoRA serving: PEFT adapters (adapter.py), the per-row batched update as a module swap (layer.py,
modules.py), and the adapter pool of device slots, host memory and disk (pool.py)."""
