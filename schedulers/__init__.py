"""Who runs next: pure scheduling decisions driven by events and a clock (no I/O)."""
