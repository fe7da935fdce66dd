"""Where metrics go: always a JSONL file in the run's folder, and Weights & Biases when asked. wandb's own default
mode is never used (a login prompt without an API key, 90 s of retries without a network): it is online only with
a key, its init is bounded, and any failure falls back to offline with one warning line."""

import contextlib
import json
import netrc
import os
import sys
from pathlib import Path

from common.cli import cannot_write, first_line

ONLINE_INIT_TIMEOUT_S = 20
# Per-layer arrays are most of a run's metrics.jsonl; float32 statistics hold about 7 digits, and the figures and
# tables that read them need far fewer, so they are kept to this many significant digits.
LAYER_DIGITS = 5


def wandb_mode() -> str:
    """An explicit WANDB_MODE wins (offline / disabled / online); otherwise online only if a key is configured."""
    mode = os.environ.get("WANDB_MODE")
    if mode in ("online", "offline", "disabled"):
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        return "online" if netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai") else "offline"
    except (netrc.NetrcParseError, OSError):
        return "offline"


def to_digits(values: list) -> list:
    """A per-layer array (nested lists too) with each float kept to LAYER_DIGITS significant digits."""
    return [to_digits(v) if isinstance(v, list) else float(f"{v:.{LAYER_DIGITS}g}") if isinstance(v, float) else v
            for v in values]


def compact(record: dict) -> dict:
    """A record as metrics.jsonl keeps it: per-layer arrays to LAYER_DIGITS significant digits, each scalar exact,
    since the summary, the printed evaluations and a study's lr and plateau rules read the scalars back."""
    return {key: to_digits(value) if isinstance(value, list) else value for key, value in record.items()}


def flatten(record: dict) -> dict:
    """A record as wandb charts, keys under their split and a list as one chart per layer: {'split': 'train',
    'residual_rms': [a, b]} -> {'train/residual_rms/00': a, 'train/residual_rms/01': b}, beside its step."""
    flat = {"step": record["step"]}
    for key, value in record.items():
        chart = f"{record['split']}/{key}"
        if isinstance(value, list):
            flat.update({f"{chart}/{i:02d}": v for i, v in enumerate(value)})
        elif key not in ("step", "split"):
            flat[chart] = value
    return flat


class Tracker:
    """Appends every record to out_dir/metrics.jsonl (compacted) and mirrors it to a wandb run."""

    def __init__(self, out_dir: Path, use_wandb: bool, config: dict, project: str, name: str,
                 group: str | None, run_id: str | None, tags: list[str] = ()):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.file = self.path.open("a")
        self.run = self._init_wandb(out_dir, config, project, name, group, run_id, tags) if use_wandb else None
        if self.run is not None:
            # Charts use our own "step" as x-axis, not wandb's internal counter: after --resume the steps since
            # the last checkpoint are logged again, and wandb would drop them as going back in time.
            self.run.define_metric("step")
            self.run.define_metric("*", step_metric="step")
            # A study table sorts runs by their best validation loss, not by wherever the last evaluation fell.
            for key in ("val/loss", "val/bpb"):
                self.run.define_metric(key, step_metric="step", summary="min")

    @staticmethod
    def _init_wandb(out_dir, config, project, name, group, run_id, tags):
        import wandb

        kwargs = dict(project=project, name=name, group=group, config=config, dir=str(out_dir), tags=list(tags),
                      id=run_id, resume="allow" if run_id else None)
        mode = wandb_mode()
        if mode == "online":
            try:
                return wandb.init(mode="online", settings=wandb.Settings(init_timeout=ONLINE_INIT_TIMEOUT_S,
                                                                          silent=True), **kwargs)
            except Exception as err:  # any network/auth failure: keep training, log offline
                print(f"warning: wandb online init failed ({first_line(err)}); logging offline instead",
                      file=sys.stderr)
                mode = "offline"
        return wandb.init(mode=mode, settings=wandb.Settings(silent=True), **kwargs)

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, record: dict) -> None:
        record = compact(record)
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as err:  # a full disk or lost permissions: stop with the checkpoints as they are
            with contextlib.suppress(OSError):
                self.file.close()  # else its unwritten buffer fails once more at exit, in a message of its own
            raise cannot_write(self.path, err, "the last checkpoint is kept: free some space or fix the permissions, "
                               "then run again with --resume") from None
        if self.run is not None:
            self.run.log(flatten(record))

    def log_figure(self, key: str, path: Path, step: int) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Image(str(path)), "step": step})

    def close(self, failed: bool = False) -> None:
        """Close the metrics file and finish the wandb run (marked failed when the run raised); idempotent."""
        self.file.close()
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        # a run that raised (a full disk, an interrupt) must not leave the file open in a process that trains on,
        # as the ablation runner does
        self.close(failed=exc_type is not None)


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl file. A line that is not one (a last line cut short by a crash mid-write, or
    garbage from elsewhere) is dropped with a warning; a --resume rewrites the file without it."""
    with open(path, errors="replace") as f:
        lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
    records, dropped = [], []
    for number, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("split"), str):
            records.append(record)
        else:
            dropped.append(number)
    if dropped and dropped == [lines[-1][0]]:
        print(f"warning: {path}:{dropped[0]}: dropped a torn last line (a crash while it was written)",
              file=sys.stderr)
    elif dropped:
        shown = ", ".join(map(str, dropped[:5])) + (", ..." if len(dropped) > 5 else "")
        print(f"warning: {path}: dropped {len(dropped)} lines that are not metrics records (lines {shown})",
              file=sys.stderr)
    return records
