"""Code execution: the sandbox and problem sets for code rewards."""
