"""The engine-source contract shared by the embedded host/ and the remote/ attach: the EngineSource
protocol, what a source declares (EngineInfo, Capabilities), and the typed channel items every source
and measurement driver (sweeps, comparisons) hands to the GUI."""
