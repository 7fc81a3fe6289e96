"""A small real training job that checkpoints and resumes (SPEC §8).

A two-layer MLP (tanh hidden layer, softmax output) learns a 3-class spiral
data set generated from a fixed seed, with minibatch SGD. Every K steps it
saves a checkpoint (weights, step, the minibatch RNG's state) to the
job-scoped persistent directory `$MA_CHECKPOINT_DIR`, which survives every
restart level; on start it resumes from the newest checkpoint there. Because
the data and the minibatch order come from seeded generators, a run that was
killed and resumed ends with exactly the weights of a run that never stopped.

Log lines (what the console and the tests read):
    [checkpoint] resumed from step=N | [checkpoint] no checkpoint, starting from step 0
    [progress] step=N loss=L
    [checkpoint] saved step=N
    [done] step=N loss=L weights_sha256=H

Settings: argv (see --help) or the environment variables TRAIN_STEPS (200),
TRAIN_CHECKPOINT_EVERY (20), TRAIN_LOG_EVERY (1), TRAIN_SLEEP_S (0.05),
TRAIN_KEEP (3 checkpoints kept). Python 3.11 stdlib and numpy only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

DATA_SEED = 1234  # the data set: identical in every run
INIT_SEED = 5678  # the initial weights
BATCH_SEED = 91011  # the minibatch order: its state is checkpointed
CLASSES, POINTS_PER_CLASS, HIDDEN = 3, 200, 32
LEARNING_RATE = 0.5
CHECKPOINT_RE = re.compile(r"^ckpt-(\d{8})\.npz$")


def env_default(name: str, default, cast):
    value = os.environ.get(name)
    return cast(value) if value not in (None, "") else default


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=env_default("TRAIN_STEPS", 200, int))
    parser.add_argument("--checkpoint-every", type=int, default=env_default("TRAIN_CHECKPOINT_EVERY", 20, int))
    parser.add_argument("--log-every", type=int, default=env_default("TRAIN_LOG_EVERY", 1, int))
    parser.add_argument("--sleep", type=float, default=env_default("TRAIN_SLEEP_S", 0.05, float))
    parser.add_argument("--keep", type=int, default=env_default("TRAIN_KEEP", 3, int))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("MA_CHECKPOINT_DIR") or "./checkpoints",
        help="default: $MA_CHECKPOINT_DIR (the job's persistent directory)",
    )
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.log_every < 1 or args.keep < 1:
        parser.error("--steps must be >= 0; --checkpoint-every, --log-every and --keep >= 1")
    return args


def spiral_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(DATA_SEED)
    xs, ys = [], []
    for label in range(CLASSES):
        radius = np.linspace(0.0, 1.0, POINTS_PER_CLASS)
        theta = np.linspace(label * 4.0, (label + 1) * 4.0, POINTS_PER_CLASS) + rng.normal(0, 0.2, POINTS_PER_CLASS)
        xs.append(np.column_stack([radius * np.sin(theta), radius * np.cos(theta)]))
        ys.append(np.full(POINTS_PER_CLASS, label))
    return np.concatenate(xs), np.concatenate(ys)


def initial_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(INIT_SEED)
    return {
        "W1": rng.normal(0, 1.0, (2, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "W2": rng.normal(0, 1.0 / np.sqrt(HIDDEN), (HIDDEN, CLASSES)),
        "b2": np.zeros(CLASSES),
    }


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    hidden = np.tanh(x @ params["W1"] + params["b1"])
    logits = hidden @ params["W2"] + params["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return hidden, probs


def loss_of(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    _, probs = forward(params, x)
    return float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())


def sgd_step(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> None:
    hidden, probs = forward(params, x)
    grad_logits = probs
    grad_logits[np.arange(len(y)), y] -= 1.0
    grad_logits /= len(y)
    grad_hidden = (grad_logits @ params["W2"].T) * (1.0 - hidden**2)
    grads = {
        "W2": hidden.T @ grad_logits,
        "b2": grad_logits.sum(axis=0),
        "W1": x.T @ grad_hidden,
        "b1": grad_hidden.sum(axis=0),
    }
    for name, grad in grads.items():
        params[name] -= LEARNING_RATE * grad


def weights_sha256(params: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(np.ascontiguousarray(params[name], dtype=np.float64).tobytes())
    return digest.hexdigest()[:16]


# -- checkpoints ----------------------------------------------------------------------
def checkpoint_files(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints in `directory`, newest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_RE.match(p.name))]
    return sorted(found, reverse=True)


def save_checkpoint(directory: Path, step: int, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Write to a temporary file, fsync, then rename: a reader never sees half a checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{step:08d}.npz"
    temp = directory / f".{final.name}.tmp-{os.getpid()}"
    with open(temp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
        np.savez(f, step=np.int64(step), rng_state=np.array(json.dumps(rng.bit_generator.state)), **params)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash of the host
    finally:
        os.close(dir_fd)


def prune_checkpoints(directory: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; drop temporary files a killed run left behind."""
    for _, old in checkpoint_files(directory)[keep:]:
        old.unlink(missing_ok=True)
    for stale in directory.glob(".ckpt-*.tmp-*"):
        if not stale.name.endswith(f".tmp-{os.getpid()}"):
            stale.unlink(missing_ok=True)


def load_latest_checkpoint(directory: Path) -> tuple[int, dict[str, np.ndarray], dict] | None:
    """The newest checkpoint that loads; an unreadable one is reported and skipped."""
    for step, path in checkpoint_files(directory):
        try:
            with np.load(path) as data:
                params = {name: data[name].copy() for name in ("W1", "b1", "W2", "b2")}
                state = json.loads(str(data["rng_state"]))
                saved_step = int(data["step"])
        except Exception as exc:  # noqa: BLE001 - any unreadable file: fall back to an older one
            print(f"[checkpoint] skipping unreadable {path.name}: {exc}", flush=True)
            continue
        if saved_step != step:
            print(f"[checkpoint] skipping {path.name}: it holds step {saved_step}", flush=True)
            continue
        return step, params, state
    return None


# -- training -------------------------------------------------------------------------
def train(args: argparse.Namespace) -> int:
    directory = Path(args.checkpoint_dir)
    x, y = spiral_data()
    rng = np.random.default_rng(BATCH_SEED)
    restored = load_latest_checkpoint(directory)
    if restored is None:
        step, params = 0, initial_params()
        print("[checkpoint] no checkpoint, starting from step 0", flush=True)
    else:
        step, params, rng_state = restored
        rng.bit_generator.state = rng_state
        print(f"[checkpoint] resumed from step={step}", flush=True)
    print(
        f"[train] mlp 2-{HIDDEN}-{CLASSES} on {len(y)} spiral points; steps={args.steps} "
        f"checkpoint_every={args.checkpoint_every} dir={directory} attempt={os.environ.get('MA_ATTEMPT', '-')}",
        flush=True,
    )
    while step < args.steps:
        batch = rng.choice(len(y), size=args.batch_size, replace=False)
        sgd_step(params, x[batch], y[batch])
        step += 1
        if step % args.log_every == 0 or step == args.steps:
            print(f"[progress] step={step} loss={loss_of(params, x, y):.6f}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint(directory, step, params, rng)
            print(f"[checkpoint] saved step={step}", flush=True)  # right after the rename: the log never lags
            prune_checkpoints(directory, args.keep)
        if args.sleep > 0:
            time.sleep(args.sleep)
    print(f"[done] step={step} loss={loss_of(params, x, y):.6f} weights_sha256={weights_sha256(params)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return train(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
