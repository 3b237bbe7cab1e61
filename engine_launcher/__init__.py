"""Build, run and watch a llama-cpp-python engine for toolpair."""
