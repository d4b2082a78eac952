"""The adapter pool: which LoRA adapters the engine knows, and where each lives.

Three tiers, as in S-LoRA / vLLM: `max_loras` device slots (the stacks the batched update reads), up to
`max_cpu_loras` more adapters in host memory (least recently used dropped first), and the rest on disk
(read again, and checked again, when a request needs them). The scheduler admits requests of at most
`max_loras` distinct adapters into the running batch, so every adapter a step needs fits in a slot; a
slot whose adapter no running request uses may be evicted for another (least recently used first).

Names are registered from any thread (add_lora / remove_lora, under a lock); slots and the host tier
change only in the engine thread, between steps. Every change is a LoraPoolEvent in the step's event.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import torch

from engine.events import LoraAdapterInfo, LoraEventKind, LoraPoolEvent, LoraPoolSnapshot
from engine.lora.adapter import LoraAdapter, load_adapter
from engine.lora.checks import check_name
from engine.lora.modules import LoraModules
from engine.models.model_config import ModelConfig


class LoraPool:
    def __init__(self, modules: LoraModules, mc: ModelConfig, max_loras: int, max_cpu_loras: int, max_rank: int,
                 dtype: torch.dtype) -> None:
        self.modules, self.mc = modules, mc
        self.max_loras, self.max_cpu_loras, self.max_rank, self.dtype = max_loras, max_cpu_loras, max_rank, dtype
        self._lock = threading.Lock()
        self._ids = itertools.count(1)  # 0 is the base model
        self._names: dict[str, LoraAdapterInfo] = {}  # registered (residence filled in by infos())
        self._known: dict[int, LoraAdapterInfo] = {}  # by id, removed ones too while requests still use them
        self._retired: set[int] = set()  # removed by name; freed once no running request uses them
        self._slots: OrderedDict[int, LoraAdapter] = OrderedDict()  # slot -> adapter, least recently used first
        self._slot_of: dict[int, int] = {}  # lora_id -> slot
        self._host: OrderedDict[int, LoraAdapter] = OrderedDict()  # host-only tier, least recently used first
        self._events: list[LoraPoolEvent] = []
        self.num_hits = self.num_loads = self.num_evictions = 0

    # ---- any thread ----------------------------------------------------------------------------
    def register(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter (in the caller's thread) and reserve its name. Raises ValueError
        (LoraLoadError) for an adapter that does not fit, or a name already in use."""
        check_name(name)
        with self._lock:
            if name in self._names:
                raise ValueError(f"a LoRA adapter named {name!r} is already loaded (remove_lora it first)")
            lora_id = next(self._ids)
        adapter = load_adapter(path, name, lora_id, self.mc, self.max_rank, self.dtype)
        info = LoraAdapterInfo(name, lora_id, adapter.path, adapter.rank, adapter.alpha, adapter.targets,
                               adapter.nbytes, "disk")
        with self._lock:
            if name in self._names:
                raise ValueError(f"a LoRA adapter named {name!r} is already loaded (remove_lora it first)")
            self._names[name] = self._known[lora_id] = info
        return adapter

    def unregister(self, name: str) -> int:
        with self._lock:
            if name not in self._names:
                raise ValueError(f"no LoRA adapter named {name!r}; loaded: {sorted(self._names) or 'none'}")
            return self._names.pop(name).lora_id

    def resolve(self, name: str | None) -> int:
        """The adapter id of a request's `lora_name` (0 for None: the base model)."""
        if name is None:
            return 0
        with self._lock:
            info = self._names.get(name)
        if info is None:
            raise ValueError(f"unknown LoRA adapter {name!r}; loaded: {sorted(self._names) or 'none'}")
        return info.lora_id

    def resolve_or_none(self, name: str) -> int | None:
        """The id registered under `name` now, or None (removed)."""
        with self._lock:
            info = self._names.get(name)
        return info.lora_id if info is not None else None

    def is_known(self, lora_id: int) -> bool:
        """Whether the pool still holds this adapter (registered, or removed but not yet collected)."""
        with self._lock:
            return lora_id in self._known

    def infos(self) -> tuple[LoraAdapterInfo, ...]:
        with self._lock:
            out = []
            for info in self._names.values():
                slot = self._slot_of.get(info.lora_id)
                where = "device" if slot is not None else "host" if info.lora_id in self._host else "disk"
                out.append(LoraAdapterInfo(info.name, info.lora_id, info.path, info.rank, info.alpha, info.targets,
                                           info.nbytes, where, slot))
            return tuple(out)

    # ---- the engine thread ---------------------------------------------------------------------
    def apply_add(self, adapter: LoraAdapter) -> None:
        self._events.append(LoraPoolEvent(LoraEventKind.ADDED, adapter.name))
        with self._lock:
            self._host[adapter.lora_id] = adapter
        self._trim_host()

    def apply_remove(self, lora_id: int, name: str) -> None:
        self._events.append(LoraPoolEvent(LoraEventKind.REMOVED, name))
        self._retired.add(lora_id)

    def prepare_batch(self, scheduled: Iterable, running: Iterable, unfinished: Iterable) -> dict[int, str]:
        """prepare() for a scheduler output: the adapters of the scheduled requests, with those of the
        running and of every unfinished request kept."""
        return self.prepare([s.request.lora_id for s in scheduled if s.request.lora_id],
                            {r.lora_id for r in running if r.lora_id}, {r.lora_id for r in unfinished if r.lora_id})

    def prepare(self, needed: Iterable[int], in_use: set[int], live: set[int]) -> dict[int, str]:
        """Before running a batch: every adapter id in `needed` gets a device slot (`in_use`: the ids
        running requests hold, whose slots must stay; `live`: the ids of every unfinished request, which
        keep a removed adapter until they are done). Returns {lora_id: reason} for adapters that could
        not be loaded (their file went away, ...); their requests fail, the others run."""
        self._collect_retired(live)
        failed: dict[int, str] = {}
        for lora_id in dict.fromkeys(needed):
            if lora_id in self._slot_of:
                self.num_hits += 1
                self._slots.move_to_end(self._slot_of[lora_id])
                continue
            info = self._known.get(lora_id)
            if info is None:  # collected after its removal: its requests fail, the batch runs
                failed[lora_id] = "its LoRA adapter was removed"
                continue
            try:
                self._load(lora_id, in_use)
            except (ValueError, OSError, RuntimeError) as exc:
                failed[lora_id] = f"LoRA adapter {info.name!r} could not be loaded: {exc}"
        return failed

    def bind(self, order: Sequence) -> None:
        """Before a forward pass (the runner calls it): each scheduled request's rows to its adapter's slot."""
        self.modules.bind([(s.request.lora_id, s.num_tokens) for s in order], self._slot_of.__getitem__)

    def unbind(self) -> None:
        self.modules.rows.segments = []

    def take_events(self) -> tuple[LoraPoolEvent, ...]:
        events, self._events = tuple(self._events), []
        return events

    def snapshot(self) -> LoraPoolSnapshot:
        with self._lock:
            slots = [None] * self.max_loras
            for slot, adapter in self._slots.items():
                slots[slot] = adapter.name
            return LoraPoolSnapshot(tuple(slots), tuple(a.name for a in self._host.values()), self.num_hits,
                                    self.num_loads, self.num_evictions, self.device_bytes, self.host_bytes)

    @property
    def device_bytes(self) -> int:
        return self.modules.nbytes

    @property
    def host_bytes(self) -> int:
        return sum(a.nbytes for a in [*self._slots.values(), *self._host.values()])

    # ---- internals -----------------------------------------------------------------------------
    def _load(self, lora_id: int, in_use: set[int]) -> None:
        t0 = time.perf_counter()
        slot = self._free_slot(in_use)
        with self._lock:
            adapter = self._host.pop(lora_id, None)
        source = "host"
        if adapter is None:  # dropped to disk: read and check it again
            info = self._known[lora_id]
            adapter = load_adapter(info.path, info.name, lora_id, self.mc, self.max_rank, self.dtype)
            source = "disk"
        self.modules.load(slot, adapter)
        with self._lock:
            self._slots[slot] = adapter
            self._slot_of[lora_id] = slot
        self.num_loads += 1
        self._events.append(LoraPoolEvent(LoraEventKind.LOAD, adapter.name, slot, source, time.perf_counter() - t0))

    def _free_slot(self, in_use: set[int]) -> int:
        free = set(range(self.max_loras)) - set(self._slots)
        if free:
            return min(free)
        for slot, adapter in self._slots.items():  # least recently used first
            if adapter.lora_id not in in_use:
                self._evict(slot, to_host=adapter.lora_id not in self._retired)
                return slot
        raise RuntimeError(f"all {self.max_loras} LoRA slots hold adapters of running requests")

    def _evict(self, slot: int, to_host: bool) -> None:
        with self._lock:
            adapter = self._slots.pop(slot)
            del self._slot_of[adapter.lora_id]
            if to_host:
                self._host[adapter.lora_id] = adapter
        self.modules.clear(slot)
        self.num_evictions += 1
        self._events.append(LoraPoolEvent(LoraEventKind.EVICT, adapter.name, slot))
        self._trim_host()

    def _trim_host(self) -> None:
        while len(self._host) > self.max_cpu_loras:
            with self._lock:
                _, adapter = self._host.popitem(last=False)
            self._events.append(LoraPoolEvent(LoraEventKind.DROP, adapter.name))

    def _collect_retired(self, live: set[int]) -> None:
        """Free what removed adapters held, once no unfinished request uses them."""
        for lora_id in [i for i in self._retired if i not in live]:
            self._retired.discard(lora_id)
            if lora_id in self._slot_of:
                self._evict(self._slot_of[lora_id], to_host=False)
            with self._lock:
                self._host.pop(lora_id, None)
                self._known.pop(lora_id, None)
