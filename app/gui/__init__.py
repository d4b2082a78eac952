"""The desktop app (Qt): main window, docks, menus, the controller that decides what a click means, presenter
mode, the feeder that hands the engine source's items to the panels, and the headless launch/screenshot
path. The only folder of app/ that builds widgets; everything below it is Qt-free but for host/'s signals."""
