"""The engine seen from toolpair's process: its command line, its memory, its supervisor and its crashes."""
