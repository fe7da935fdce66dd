"""The bottom layer: what data/, model/, trainer/ and the scripts need, importing nothing of ours.

cli: the one-line error type and the command-line runner;
fs: crash-safe file writes and a lock;
environment: where a result came from."""
