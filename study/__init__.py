"""The study layer: what a normalization study needs beyond one training run (today, training a study's runs side by
side under torchrun). It imports common, data, model and trainer; scripts import it."""
