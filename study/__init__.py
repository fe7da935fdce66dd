"""The study layer: what a normalization study needs beyond one training run (README.md lists its modules). It
imports common, data, model and trainer, never the reverse; scripts/run_ablation.py is its command line."""
