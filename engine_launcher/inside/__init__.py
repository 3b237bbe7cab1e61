"""Code that runs inside the engine's own process: toolpair's fixes to llama-cpp-python, the RPC entry, speed runs.

Started as ``python -m engine_launcher.inside.engine_main MODULE ...``; nothing here runs in the proxy.
"""
