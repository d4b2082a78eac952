"""`inferlab` (the desktop app) and `inferlab --screenshot OUT.png --preset NAME --run-seconds N`.

qasync runs asyncio inside the Qt event loop: the screenshot run is a coroutine that waits for the
model, lets the preset run, grabs the window and quits. The engine itself runs in the engine loop's
thread (engine/serving/loop.py, hosted by app/host/engine_host.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import traceback
from pathlib import Path

DEFAULT_PRESET = "continuous-batching"
SCREENSHOT_SIZE = (1600, 1000)
LOAD_TIMEOUT_S = 600.0
ATTACH_GIVE_UP_S = 10.0  # a headless run attached to a server that is down or answers garbage this long ends
EXIT_TIMEOUT_S = 60.0


def prepare_qt_environment() -> None:
    """Before the QApplication exists. Qt's raster engine splits large fills over a GUI thread pool
    and waits for it; with the engine keeping the cores busy those workers wait for a core, and the
    event loop with them. Painting on the GUI thread alone is steadier here."""
    os.environ.setdefault("QT_NO_GUI_THREADPOOL", "1")


def run_gui(args) -> int:
    prepare_qt_environment()
    if args.screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from app.gui.qt_check import platform_problem
    from app.talk.compare.profile import use_profile

    try:
        if getattr(args, "profile", None):
            use_profile(args.profile)
    except ValueError as exc:
        print(f"inferlab: error: --profile: {exc}", file=sys.stderr)
        return 2
    problem = platform_problem()
    if problem is not None:  # Qt would abort the process with a message that names one library at best
        print(f"inferlab: error: {problem}", file=sys.stderr)
        return 2
    import qasync
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.device_args import device_options
    from app.gui.main_window import MainWindow
    from app.gui.settings_file import user_settings
    from app.host.engine_host import EngineHost
    from engine.config import EngineConfig
    from engine.events import KernelBuild
    from engine.runner.threads import count_as_other, forget_other

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("inferlab")
    app.setApplicationName("inferlab")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)

    replay_preset = None
    if getattr(args, "replay", None):  # a recording in place of an engine
        from app.record.reader import RecordingError, open_recording
        from app.replay.source import ReplaySource

        try:
            with open_recording(args.replay) as rec:  # refused in one line before a window opens
                replay_preset = rec.header.get("preset") if isinstance(rec.header.get("preset"), str) else None
        except RecordingError as exc:
            print(f"inferlab: error: --replay: {exc}", file=sys.stderr)
            return 2
        host = ReplaySource(args.replay, speed=args.speed)
    elif getattr(args, "manage", None):  # a server inferlab starts, restarted by the sliders
        from app.managed.args import managed_source

        try:
            host = managed_source(args)
        except ValueError as exc:
            print(f"inferlab: error: --manage {args.manage}: {exc}", file=sys.stderr)
            return 2
    elif getattr(args, "attach", None):  # an OpenAI-compatible server instead of the embedded engine
        from app.remote.source import RemoteSource

        try:
            host = RemoteSource(args.attach, args.api_key)
        except ValueError as exc:
            print(f"inferlab: error: --attach: {exc}", file=sys.stderr)
            return 2
    else:
        # the native kernels' first build runs in the background: live tokens on torch's kernels meanwhile
        # the engine's threads follow the free cores; this (the GUI) thread counts as another process's, so
        # it is left a core only while it keeps one busy (engine/runner/threads.py)
        count_as_other(threading.get_native_id(), "the GUI")
        host = EngineHost(EngineConfig(model=args.model, dtype=getattr(args, "dtype", "auto"),
                                       num_threads=getattr(args, "threads", None),
                                       kernel_build=KernelBuild.BACKGROUND,
                                       **device_options(args)))
    if args.screenshot:  # reproducible pictures: default layout and theme, nothing read or saved
        scratch = tempfile.mkdtemp(prefix="inferlab-shot-")
        settings = QSettings(str(Path(scratch) / "settings.ini"), QSettings.Format.IniFormat)
        # a screenshot's --size stands for the screen it opens on: the window fits it as it would a real one
        window = MainWindow(host, settings, persist=False, screen_size=args.size or SCREENSHOT_SIZE)
        window.controller.interactive = False
        window.resize(*(args.size or SCREENSHOT_SIZE))
    else:
        settings, persist = user_settings()  # (its file checked first: a FIFO there hung the start)
        window = MainWindow(host, settings, persist=persist)
    last = None if getattr(args, "replay", None) else _last_preset(settings)  # a replay: its own chapter
    preset = args.preset or replay_preset or last or DEFAULT_PRESET
    if getattr(args, "record", None):
        window.recording.start(args.record, args.record_limit)
    window.show()
    host.start()  # after show(): the window is up before the model starts loading
    try:
        code = _run_window(app, loop, window, host, args, preset)
    except KeyboardInterrupt:
        code = 130
    except Exception:  # noqa: BLE001 (the engine thread stops first on every way out, then the error shows)
        traceback.print_exc()
        code = 1
    finally:
        forget_other(threading.get_native_id())  # the window is closed: this thread is ours again
    return finish(host, code)


def _run_window(app, loop, window, host, args, preset: str) -> int:
    """Apply the preset, then run until the window closes (or the screenshot is saved)."""
    ok = window.controller.apply_preset(preset)
    if args.presenter:  # a screenshot keeps its given size; the app goes full screen
        window.set_presenter(True, full_screen=not args.screenshot,
                             screen_height=args.size[1] if args.screenshot and args.size else None)
    if args.screenshot and not ok:
        print(f"inferlab: error: {window.controller.last_error}", file=sys.stderr)
        window.close()
        return 2  # finish() still waits for the loading engine thread: exiting under it aborts in C++
    with loop:
        if args.screenshot:
            return loop.run_until_complete(screenshot(window, host, Path(args.screenshot), args.run_seconds,
                                                      report=args.report, preset=preset))
        closed = asyncio.Event()
        app.lastWindowClosed.connect(closed.set)
        interrupted = []

        def on_sigint(signum, frame) -> None:  # Ctrl+C in the terminal: close as the window's X does (the
            # layout saved, the engine stopped); raised inside a Qt callback it was printed and swallowed
            if not interrupted:
                print("\ninferlab: interrupted: closing the window", file=sys.stderr)
            interrupted.append(signum)
            loop.call_soon(window.close)

        main = threading.current_thread() is threading.main_thread()  # signal handlers: the main thread's only
        previous = signal.signal(signal.SIGINT, on_sigint) if main else None
        try:
            loop.run_until_complete(closed.wait())
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        return 130 if interrupted else 0


def finish(host, code: int) -> int:
    """Wait for the engine thread (a long prefill step cannot be cut short). Exiting while it runs
    torch code would abort in C++ destructors, so if it will not stop, leave without them."""
    if host.shutdown(timeout=EXIT_TIMEOUT_S):
        return code
    print(f"inferlab: the engine thread did not stop within {EXIT_TIMEOUT_S:.0f} s; exiting anyway",
          file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _last_preset(settings) -> str | None:
    value = settings.value("last_preset")
    return str(value) if value and Path(str(value)).is_file() else None


async def wait_loaded(window, host, timeout: float = LOAD_TIMEOUT_S, give_up_s: float = ATTACH_GIVE_UP_S) -> str | None:
    """None once the model is loaded and the window knows it, else the error. An attached server that has
    been down, or answering what is not metrics, for `give_up_s` on end is the error at once, in its
    status's words (a /metrics that never parsed held a headless run for the whole `timeout`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    failing_since = None
    while not (host.loaded and window.controller.engine_ready):
        if host.load_error is not None:
            return host.load_error
        if loop.time() > deadline:
            return f"the model did not load within {timeout:.0f} s"
        state, text = getattr(host, "status", ("", ""))  # (an attached server's connection)
        failing_since = (failing_since or loop.time()) if state in ("down", "garbage") else None
        if failing_since is not None and loop.time() - failing_since >= give_up_s:
            return f"{text.split('; retrying')[0]} (for {give_up_s:.0f} s; giving up)"
        await asyncio.sleep(0.05)
    return None


async def screenshot(window, host, out: Path, run_seconds: float, report: str | None = None,
                     preset: str = "") -> int:
    error = await wait_loaded(window, host)
    if error is not None:
        print(f"inferlab: error: {error}", file=sys.stderr)
        window.close()
        return 2
    if report:  # the run sampled: does the preset keep up with its arrivals (app/gui/soak.py)
        from app.gui.soak import sample_run, verdict

        samples = await sample_run(window, run_seconds)
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps({"preset": preset, "run_seconds": run_seconds,
                                            **verdict(samples), "samples": samples}, indent=1))
    elif getattr(host, "ended", None) is not None:  # a replay: its run, or the end of the recording if sooner
        deadline = asyncio.get_running_loop().time() + run_seconds
        while not host.ended and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # its last items drained into the panels
    else:
        await asyncio.sleep(run_seconds)
    window.flush_panels()
    await asyncio.sleep(0.1)  # let the last repaint land
    out.parent.mkdir(parents=True, exist_ok=True)
    saved = window.grab().save(str(out))
    window.close()
    if not saved:
        print(f"inferlab: error: could not write {out}", file=sys.stderr)
        return 2
    print(f"saved {out}")
    return 0
