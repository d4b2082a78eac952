"""Recordings (`.inferlab-run`): an engine source's channel written down, and read back to replay.

Qt-free (a GPU box with no display records through the engine's Python API): the codec (codec.py), the file
format with its writer and streaming reader (writer.py, reader.py), the recorder that listens to an LLMEngine
(engine_recorder.py). The replaying source, a Qt object, is app/replay/.
"""
