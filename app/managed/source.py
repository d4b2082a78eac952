"""ManagedSource: the app attached to a server that inferlab started (`inferlab --manage ENGINE`), whose
batch / weights / draft sliders work by restarting it with that engine's own flags.

It is the attach source (app/remote/source.py: scrape, streams, load generator, all in its worker thread)
plus a `ManagedServer` (app/managed/server.py) on a fixed port, so the URL survives restarts.
Its Capabilities declare those knobs `restartable`; the controller sends them through `reconfigure()`.

Threads: `reconfigure()` (GUI thread) only posts the wish to the worker. The worker coalesces a burst
of wishes (one restart, DEBOUNCE_S after the last one), pauses the load and the scraper, aborts what is
in flight, and runs the restart itself (a subprocess and a /health wait) in a thread of its own
(`asyncio.to_thread`), so neither the GUI nor the worker's loop waits for it. A point that does not
start (PointFailed) brings the last good point back; either way a `ServerRestarted` item says what runs
now, with the reason and the server's log tail when the asked point failed.
"""
from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable

from app.managed.child import free_port
from app.managed.knobs import RESTARTABLE, changed_flags, knob_values, point_with
from app.managed.server import ManagedServer, PointFailed
from app.managed.table import FlagError, ServedModel, ServerPoint
from app.remote.source import RemoteSource
from app.source import channel
from app.source.engine_info import Capabilities

DEBOUNCE_S = 0.8  # slider moves closer together than this are one restart


class ManagedSource(RemoteSource):
    def __init__(self, server: ManagedServer, *, debounce_s: float = DEBOUNCE_S,
                 setup: Callable[[Callable[[str], None]], ServedModel] | None = None, **kw) -> None:
        """setup(say): what the server loads, found (or converted) in the worker before the first start."""
        if server.port is None:
            server.port = free_port()
        super().__init__(f"http://127.0.0.1:{server.port}", **kw)
        self.server = server
        self.debounce_s = debounce_s
        self.setup = setup
        self.restarts = 0  # restarts run (asked points and returns to the last good one count once)
        self._wanted: ServerPoint = server.point  # worker thread only
        self._wished_at = 0.0
        self._restarter: asyncio.Task | None = None

    @property
    def engine_name(self) -> str:
        return self.server.engine.name

    # --- commands (GUI thread) ----------------------------------------------------------------
    def reconfigure(self, **knobs) -> None:
        """Restartable knobs: a restart with the new flags, soon (see the module's doc); others: refused."""
        others = {k: v for k, v in knobs.items() if k not in RESTARTABLE}
        super().reconfigure(**others)  # raises for what a server does not change from a client
        restart = {k: v for k, v in knobs.items() if k in RESTARTABLE}
        if restart:
            self._moved(self.server.point, restart)  # a bad value is refused here, in the caller's thread
            self._post(lambda: self._wish(restart))

    def _moved(self, point: ServerPoint, knobs: dict) -> ServerPoint:
        """`point` with the sliders' values, the weights stop as this engine's format (one the model has)."""
        return point_with(point, knobs, self.engine_name, tuple(self.server.model.by_format))

    # --- worker thread ------------------------------------------------------------------------
    async def _main(self) -> None:
        try:
            if self.setup is not None:
                self.sigLoadProgress.emit(f"finding {self.engine_name}'s weights", 0.0)
                say = lambda line: self.sigLoadProgress.emit(line, 0.0)  # noqa: E731
                self.server.model = await asyncio.to_thread(self.setup, say)
            self.sigLoadProgress.emit(f"starting {self.engine_name} ({self.server.point.label()})", 0.0)
            await asyncio.to_thread(self.server.start)
        except (PointFailed, ValueError, OSError) as exc:  # ValueError: no weights for it (tune_cli's setup)
            self.load_error = f"{self.engine_name} did not start: {exc}"
            self.sigLoadFailed.emit(self.load_error)
            return
        try:
            await super()._main()
        finally:
            if self._restarter is not None:  # a restart under way ends first: nothing it starts is left behind
                await asyncio.gather(self._restarter, return_exceptions=True)
            await asyncio.to_thread(self.server.stop)

    def _capabilities(self, has_metrics: bool) -> Capabilities:
        return Capabilities(load_generator=True, server_metrics=has_metrics, client_timings=True,
                            restartable=RESTARTABLE)

    def _info_config(self) -> dict:
        return {**knob_values(self.server.point), "command": shlex.join(self.server.command)}

    def _wish(self, knobs: dict) -> None:
        self._wanted = self._moved(self._wanted, knobs)
        self._wished_at = time.perf_counter()
        if self._restarter is None or self._restarter.done():
            self._restarter = asyncio.get_running_loop().create_task(self._restart_when_quiet())

    async def _restart_when_quiet(self) -> None:
        """Wait until the sliders have been still for debounce_s, restart once; again if they moved meanwhile."""
        while not self._stopping.is_set():
            quiet_in = self._wished_at + self.debounce_s - time.perf_counter()
            if quiet_in > 0:
                await asyncio.sleep(quiet_in)
                continue
            target = self._wanted
            if target == self.server.point and self.server.alive():
                return
            await self._restart(target)
            if self._wanted == target:
                return

    def _flags_text(self, target: ServerPoint) -> str:
        s = self.server
        try:
            new_argv = s.engine.argv(s.exe, s.model, target, s.port, s.threads)
        except FlagError:
            return target.label()  # the restart says why it cannot run
        return changed_flags(s.command, new_argv)

    async def _restart(self, target: ServerPoint) -> None:
        name, good = self.engine_name, self.server.point
        text = f"restarting {name} with {self._flags_text(target)}…"
        self.publish(channel.Busy(text, None))
        resume = self.loadgen.running
        self.loadgen.stop()  # the live load pauses: nothing new is sent to a server that is going away
        self.watch.paused = True
        self.publish(channel.ServerStatus("restarting", text))  # the Server panel says it too
        await self._abort_in_flight()
        failed = log_tail = ""
        try:
            await asyncio.to_thread(self.server.restart, target)
        except PointFailed as exc:
            failed, log_tail = str(exc), exc.log_tail
            if self._wanted == target:
                self._wanted = good  # the sliders go back with it
            self.publish(channel.Busy(f"{name} did not start at {target.label()}; back to {good.label()}…", None))
            try:
                await asyncio.to_thread(self.server.restart, good)
            except PointFailed as again:
                failed += f"\n(the last good point did not start again either: {again})"
        finally:
            self.watch.paused = False
        self.restarts += 1
        self.publish(channel.ServerStatus(*self.watch.status))  # the connection as the scraper knows it
        self.publish(channel.ServerRestarted(knob_values(self.server.point), shlex.join(self.server.command),
                                             failed, log_tail))
        self.publish(channel.Busy("", None))
        if resume and self.server.alive():
            self.loadgen.start(time.perf_counter())  # after /health answered: the load resumes

    async def _abort_in_flight(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
