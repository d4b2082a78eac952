"""The desktop app (Qt): main window, docks, menus, the controller that decides what a click means, presenter
mode, the feeder that hands the engine source's items to the panels, and the headless launch/screenshot
path. The only folder of app/ that imports Qt (PySide6, pyqtgraph, qasync) or widgets/ (pyproject.toml's
import-linter contract); the engine sources below it are Qt-free (app/source/notice.py)."""
