"""The process's native memory outside any framework: glibc's heap (``heap``)."""
