"""Chat templates: the one renderer (engine, check-template and count_tokens) and the template analysis."""
