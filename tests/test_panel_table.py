"""The window's panels come from one table (app/talk/panel_specs.py): the typed Panels, the docks' titles,
what presets may name and what each panel needs from the source all read it."""
from __future__ import annotations

import dataclasses
import types

import pytest

from app.gui.panels import Panels, make_panels
from app.talk import presets
from app.talk.panel_specs import PANEL_NAMES, PANEL_SPECS


def test_panels_fields_are_the_table_rows_in_order():
    assert [f.name for f in dataclasses.fields(Panels)] == [spec.name for spec in PANEL_SPECS]
    assert set(PANEL_NAMES) == {s.name for s in PANEL_SPECS} - {"server"}  # the server panel is the app's own


def test_panels_are_typed_frozen_and_named_by_the_table(qapp):
    panels = make_panels()
    assert [name for name, _ in panels.items()] == [spec.name for spec in PANEL_SPECS]
    assert panels.named("timeline") is panels.timeline
    with pytest.raises(dataclasses.FrozenInstanceError):
        panels.tokens = panels.memory
    with pytest.raises(KeyError):
        panels.named("timelines")  # a misspelt name from data fails at once, naming it


def test_a_preset_naming_an_unknown_panel_is_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[preset]\ntitle = "T"\ncaption = "C"\npanels = ["tokens", "server"]\n')
    with pytest.raises(presets.PresetError, match="panel names"):
        presets.load_preset(str(path))


def test_every_need_names_a_declared_capability():
    from app.source.engine_info import Capabilities

    declared = {f.name for f in dataclasses.fields(Capabilities)}
    for spec in PANEL_SPECS:
        for capability, what in spec.needs:
            assert what and capability in declared, (spec.name, capability)  # a typo would grey it out for good


def test_preset_actions_is_a_part_with_its_dependencies_given(tmp_path):
    """PresetActions needs no controller: its state and the controller's verbs are handed in."""
    from app.gui.control_state import ControlState
    from app.gui.preset_actions import PresetActions
    from app.talk.knob_defaults import engine_knob_defaults

    class Verbs:
        def __init__(self):
            self.errors: list[str] = []

        def push_config(self): ...
        def sync_actions(self): ...
        def set_load_running(self, running): ...

        def error(self, message, title="inferlab"):
            self.errors.append(message)

    state = ControlState(config=engine_knob_defaults(), arrival_rate=1.0, source_name="test", start_kv_blocks=None,
                         presets_dir=tmp_path)
    verbs = Verbs()
    host = types.SimpleNamespace(info=None)  # a source that has not loaded yet
    actions = PresetActions(window=None, host=host, panels=None, caption=None, cues=None, state=state, verbs=verbs)
    (tmp_path / "broken.toml").write_text('[preset]\ntitle = "T"\n')
    assert not actions.apply_preset("broken") and "caption: missing" in verbs.errors[0]
    assert state.preset is None  # a broken preset changes nothing
    assert not actions.spec_live()  # no engine info yet: speculation would need a rebuild


_ECHO_PANEL = '''"""A throwaway panel (tests/test_panel_table.py walks the list of files a new panel touches)."""
from widgets.panel_base import Panel


class EchoPanel(Panel):
    def reset(self) -> None: ...

    def _repaint(self) -> None: ...
'''
_PANEL_WALK = '''
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication([])
from app.gui.availability import grey_out_features
from app.gui.panels import make_panels
from app.gui.window_docks import build_docks
from app.source.engine_info import Capabilities
from app.talk import presets
panels = make_panels()
window = QMainWindow()  # held: the docks are its children
docks = build_docks(window, panels)
assert docks["echo"].windowTitle() == "Echo" and docks["echo"].widget() is panels.echo  # docked, titled
assert presets.load_preset("p.toml").panels == ("tokens", "echo")  # a preset may raise it
grey_out_features(panels, Capabilities(step_events=True), "a test server", engine_ready=True)
assert not panels.echo.is_available() and "Echoes of the drafts" in panels.echo.overlay_text()
grey_out_features(panels, Capabilities(step_events=True, speculative=True), "a test server", engine_ready=True)
assert panels.echo.is_available()
print("walked")
'''


def test_a_new_panel_touches_its_widget_the_table_and_panels_py(tmp_path):
    """The newcomer's list for a new panel, walked in a copy of the code: a widget file, one PanelSpec row,
    one Panels field and its construction. Docked, titled, nameable by presets and greyed out when the source
    lacks its need, with no other file edited (feeding it events is panel_feeder.py's, per panel)."""
    from tests.code_copy import copy_code, edit, run_script

    root = copy_code(tmp_path)
    (root / "widgets" / "echo_panel.py").write_text(_ECHO_PANEL)
    edit(root / "app" / "talk" / "panel_specs.py",
         '    PanelSpec("lora", "LoRA adapters", (("lora", "multi-LoRA serving"),)),\n',
         '    PanelSpec("echo", "Echo", (("speculative", "echoes of the drafts"),)),\n')
    panels_py = root / "app" / "gui" / "panels.py"
    edit(panels_py, "from widgets.server_panel import ServerPanel\n", "from widgets.echo_panel import EchoPanel\n")
    edit(panels_py, "    lora: LoraPanel\n", "    echo: EchoPanel\n")
    edit(panels_py, "lora=LoraPanel(), ", "echo=EchoPanel(), ")
    (root / "p.toml").write_text('[preset]\ntitle = "T"\ncaption = "C"\npanels = ["tokens", "echo"]\n')
    assert "walked" in run_script(root, _PANEL_WALK)
