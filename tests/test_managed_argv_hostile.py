"""argv injection against the managed servers' flag tables: model names and paths with spaces, quotes,
newlines, `;`, `$(...)`, a leading "-", a NUL byte, and --server-args with shell metacharacters. The argv
is a list (never a shell) and the copyable command line, pasted into a shell, runs exactly that argv."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from app.managed.engines import ENGINES
from app.managed.llama_server import LlamaServer
from app.managed.server import ManagedServer, PointFailed
from app.managed.table import FlagError, ServedModel, ServerPoint
from app.tradeoff.tune_cli import sized_engine
from app.tradeoff.tune_measure import TuneLoad

NASTY = ["my model.gguf", "it's \"quoted\".gguf", "a;touch pwned;.gguf", "new\nline.gguf", "$(touch pwned).gguf",
         "`touch pwned`.gguf", "x|y&z>w.gguf", "ünï cödé.gguf"]
POINT = ServerPoint(batch=2, weight_format="bf16", draft=4)


def echo_argv(tmp_path) -> str:
    """An executable that prints the argv it got as JSON (what a pasted command line really runs)."""
    exe = tmp_path / "echo-argv"
    exe.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    exe.chmod(0o755)
    return str(exe)


def pasted(command: str, cwd) -> list[str]:
    out = subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("engine", list(ENGINES.values()), ids=list(ENGINES))
def test_the_copied_command_line_runs_exactly_the_argv_whatever_the_model_is_called(tmp_path, engine):
    exe = echo_argv(tmp_path)
    for name in NASTY:
        model = ServedModel({"bf16": str(tmp_path / name)}, draft=str(tmp_path / ("draft " + name)), name=name)
        argv = engine.argv(exe, model, POINT, 8080)
        assert str(tmp_path / name) in argv  # one argv element, as given
        copied = shlex.join(argv)
        assert shlex.split(copied) == argv
        assert pasted(copied, tmp_path) == argv[1:]
    assert not (tmp_path / "pwned").exists()


def test_server_args_with_shell_metacharacters_stay_arguments(tmp_path):
    extra = tuple(shlex.split("--alias 'a;touch pwned' --api-key \"$(touch pwned)\" --x `y`"))
    engine = sized_engine(LlamaServer(), TuneLoad(), extra)
    argv = engine.argv(echo_argv(tmp_path), ServedModel({"bf16": "m.gguf"}, name="m"), ServerPoint(), 8080)
    assert argv[-len(extra):] == list(extra) and "a;touch pwned" in argv
    assert pasted(shlex.join(argv), tmp_path) == argv[1:]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("engine", list(ENGINES.values()), ids=list(ENGINES))
def test_a_model_file_whose_name_begins_with_a_dash_is_passed_as_a_file(tmp_path, monkeypatch, engine):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "--trust-remote-code").write_text("a file, not a flag")
    model = ServedModel({"bf16": "--trust-remote-code"}, draft="--trust-remote-code", name="m")
    argv = engine.argv("server", model, POINT, 8080)
    assert "./--trust-remote-code" in argv and "--trust-remote-code" not in argv


@pytest.mark.parametrize("engine", list(ENGINES.values()), ids=list(ENGINES))
def test_a_model_name_that_is_a_flag_is_refused_before_launch(tmp_path, monkeypatch, engine):
    monkeypatch.chdir(tmp_path)  # no such file here
    with pytest.raises(FlagError, match="begins with '-'"):
        engine.argv("server", ServedModel({"bf16": "--trust-remote-code"}, name="m"), ServerPoint(), 8080)


def test_a_nul_byte_in_the_model_path_is_a_failed_point_not_a_crash(tmp_path):
    server = ManagedServer(LlamaServer(), echo_argv(tmp_path), ServedModel({"bf16": "m\0.gguf"}, name="m"),
                           ServerPoint(),
                           start_timeout_s=5.0)
    with pytest.raises(PointFailed, match="could not be started"):
        server.start()
    assert not server.alive() and server.command == []


def test_server_args_with_an_unclosed_quote_are_one_line_and_exit_2(tmp_path, capsys):
    from app.cli import main

    code = main(["tune", "--engine", "vllm", "--server-bin", echo_argv(tmp_path), "--model", "m",
                 "--server-args", "--alias 'unclosed", "--json", str(tmp_path / "out.json")])
    assert code == 2
    assert "inferlab tune: --server-args \"--alias 'unclosed\": No closing quotation" in capsys.readouterr().err


def _crashing_llama_server(tmp_path) -> tuple[str, object]:
    """A stand-in llama-server: dies of SIGSEGV unless --no-repack is among its flags (as llama.cpp 0.3.36's
    did with repacked weights on a Sapphire Rapids Xeon), else answers /health on its --port."""
    calls = tmp_path / "calls.txt"
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + f"""import http.server, os, signal, sys
argv = sys.argv[1:]
with open({str(calls)!r}, "a") as f:
    f.write(" ".join(argv) + "\\n")
if "--no-repack" not in argv:
    os.kill(os.getpid(), signal.SIGSEGV)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health).serve_forever()
""")
    exe.chmod(0o755)
    return str(exe), calls


def test_a_llama_server_that_crashes_at_start_runs_again_without_repacking_and_says_so(tmp_path):
    exe, calls = _crashing_llama_server(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    server = ManagedServer(LlamaServer(), exe, ServedModel({"bf16": str(tmp_path / "m.gguf")}, name="m"),
                           ServerPoint(batch=2), threads=1, start_timeout_s=20.0)
    try:
        server.start()
        assert server.alive() and server.command[-1] == "--no-repack"
        assert "signal 11" in server.note and "--no-repack" in server.note
    finally:
        server.stop()
    tried = calls.read_text().splitlines()
    assert len(tried) == 2 and "--no-repack" not in tried[0] and not server.alive()


def test_a_llama_server_that_crashes_whatever_it_is_given_is_a_failed_point_after_one_retry(tmp_path):
    calls = tmp_path / "calls.txt"
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\nimport os, signal, sys\n"
                   f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                   "os.kill(os.getpid(), signal.SIGSEGV)\n")
    exe.chmod(0o755)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    server = ManagedServer(LlamaServer(), str(exe), ServedModel({"bf16": str(tmp_path / "m.gguf")}, name="m"),
                           ServerPoint(), start_timeout_s=20.0)
    with pytest.raises(PointFailed, match=r"exited \(-11\)"):
        server.start()
    tried = calls.read_text().splitlines()
    assert len(tried) == 2 and tried[1].endswith("--no-repack") and not server.alive()
