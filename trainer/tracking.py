"""Where metrics go: a JSONL file in the run's folder, and Weights & Biases when asked.
wandb never asks for a login or retries a dead network for minutes:
it is online only with WANDB_API_KEY (or WANDB_MODE), its start is bounded,
and a failure there logs offline instead, with a warning."""

import contextlib
import json
import os
import sys
from pathlib import Path

from common.cli import first_line
from common.fs import write_atomically


def compact(value, digits: int = 5):
    """Per-layer arrays, most of a metrics file, to 5 significant digits
    (float32 statistics hold about 7; the figures need far fewer);
    scalars stay exact: summaries and studies read them."""
    if isinstance(value, list):
        return [compact(v, digits) if isinstance(v, list) else float(f"{v:.{digits}g}")
                for v in value]
    return value


def flatten(record: dict) -> dict:
    """A record as wandb charts it: {'split': 'train', 'residual_rms': [a, b]} ->
    {'train/residual_rms/00': a, 'train/residual_rms/01': b}, beside its step."""
    flat = {"step": record["step"]}
    for key, value in record.items():
        if isinstance(value, list):
            flat |= {f"{record['split']}/{key}/{i:02d}": v for i, v in enumerate(value)}
        elif key not in ("step", "split"):
            flat[f"{record['split']}/{key}"] = value
    return flat


class Tracker:
    """Appends every record to out_dir/metrics.jsonl and mirrors it to a wandb run;
    a context manager that closes both,
    and marks the wandb run failed when the block raised."""

    # set once an online start failed: a study's later runs in this process go offline at once
    online_failed = False

    def __init__(self, out_dir: Path, use_wandb: bool, config: dict,
                 project: str, name: str, group: str | None, run_id: str | None,
                 tags: list[str] = ()):
        self.file = (Path(out_dir) / "metrics.jsonl").open("a")
        self.run = None
        if use_wandb:
            import wandb

            kwargs = dict(project=project, name=name, group=group, config=config,
                          dir=str(out_dir), tags=list(tags),
                          id=run_id, resume="allow" if run_id else None)
            key = os.environ.get("WANDB_API_KEY")
            mode = os.environ.get("WANDB_MODE") or ("online" if key else "offline")
            if mode == "online" and Tracker.online_failed:
                mode = "offline"
            try:
                settings = wandb.Settings(init_timeout=20, silent=True)
                self.run = wandb.init(mode=mode, settings=settings, **kwargs)
            except Exception as err:
                # a network or key problem: keep training, log offline
                print("warning: wandb could not start online "
                      f"({first_line(err)}); logging offline", file=sys.stderr)
                Tracker.online_failed = True
                # the failed start can still hold the run's id in wandb's service
                with contextlib.suppress(Exception):
                    wandb.teardown()
                self.run = wandb.init(
                    mode="offline", settings=wandb.Settings(silent=True), **kwargs)
            if self.run.offline:  # nothing reaches wandb.ai until it is synced
                # every start of the run (a --resume adds one) has its folder
                parts = Path(self.run.dir).parents[1] / f"offline-run-*-{self.run.id}"
                print(f"wandb: logging offline; upload with `wandb sync {parts}`",
                      file=sys.stderr)
            # x-axis: our own step,
            # so that the steps a --resume trains again are not dropped as going back
            self.run.define_metric("step")
            self.run.define_metric("*", step_metric="step")

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, record: dict) -> None:
        record = {key: compact(value) for key, value in record.items()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()  # a crash loses no logged line
        if self.run is not None:
            self.run.log(flatten(record))

    def close(self, failed: bool = False) -> None:
        self.file.close()
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        # a runner that trains on must not keep the file open
        self.close(failed=exc_type is not None)


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl file;
    a line that is not one (the last, cut short by a kill mid-write) is skipped,
    and a --resume rewrites the file without it."""
    records = []
    for line in Path(path).read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return [r for r in records if isinstance(r, dict) and "step" in r and "split" in r]


def keep_records_up_to(path: Path, step: int) -> None:
    """On --resume, drop the records logged after the checkpoint's step:
    those steps train again.
    Written afresh:
    a link at its path (even dangling) is replaced, never written through."""
    records = read_metrics(path) if path.is_file() else []
    write_atomically(path, "".join(json.dumps(r) + "\n"
                                   for r in records if r["step"] <= step))
