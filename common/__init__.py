"""The bottom layer: what data/, model/, trainer/ and the scripts all need, importing nothing of the
project.

cli: the one-line error type and the command-line runner; fs: crash-safe file writes and a lock;
environment: where a result came from."""
