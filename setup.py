"""The one native module, built where a C compiler is present; without one the Python path does its work.

``proxy/normalize/_scan.c`` decides the ordering rules on a JSONL line's bytes for
``toolpair normalize``. It is plain C with the default flags (no CPU-specific
code), and optional: a build that cannot compile it still installs, and
``proxy.normalize.core`` then parses every line in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("proxy.normalize._scan", ["proxy/normalize/_scan.c"], optional=True)])
