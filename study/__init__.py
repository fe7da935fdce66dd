"""The study layer: what a normalization study needs beyond one training run. variants.py names the setups a study
compares; settings.py checks what its command line asks for; runner.py plans, trains and reuses its runs (side by
side under torchrun through parallel.py), with lr_tuning.py's rules for --tune_lr; report.py and plots.py write
its tables and figures. It imports common, data, model and trainer; scripts import it (scripts/run_ablation.py is
the study's command line)."""
