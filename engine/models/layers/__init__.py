"""The model's layers. Importing them points inductor at a cache folder of the forced ISA's own, for every
torch.compile in this process (ours and any other): see inductor_cache.py."""
from engine.models.layers.inductor_cache import inductor_cache_per_isa

inductor_cache_per_isa()
