"""Data-parallel online learning over Ray actors.

A batch of ``batch_size`` streams is split into ``num_workers`` shards of
consecutive streams (sizes differ by at most one when the batch does not
divide evenly). Each shard lives in one Ray actor, which owns a learner
compiled for that shard's size: the streams' hidden states and eligibility
traces stay in the actor, and nothing of them crosses the network. Every
update (:meth:`DataParallel.step`):

1. the driver sends each actor its columns of ``xs`` / ``ys`` (time-major,
   ``(T, B, ...)``, split along axis 1);
2. each actor runs ``etrace_grad`` on its shard and returns its gradients;
3. the driver averages them, weighted by shard size (``B_i / B``: for a
   loss that is a mean over the batch, as ``"mse"`` and ``"cross_entropy"``
   are, this is exactly the gradient of the whole batch);
4. every actor applies the same averaged gradients with its own copy of the
   optimiser, so parameters and optimiser states stay identical on every
   replica (they start identical: the driver copies worker 0's parameters
   to the others).

Transport: **the object store**, with the driver as the reducer. Ray's
collective library (``ray.util.collective``) needs the ``pygloo`` package
for its CPU (gloo) backend, which has no wheels for current Python
versions, or NCCL, which needs GPUs; the object store works on every Ray
installation. Each update moves, per worker, its gradients up to the driver
and the averaged gradients back (each ``P × itemsize`` bytes, ``P`` the
number of parameters; the average is put into the store once and every
worker reads the same object), plus the worker's share of the inputs. The
driver's link carries ``2 × N × P × itemsize`` bytes per update: that is
where this stops scaling (see the book's chapter "Many streams, many
machines").

Faults: :meth:`DataParallel.run` writes a checkpoint every
``checkpoint_every`` updates (each worker's learner and optimiser,
:func:`braintrace_rs.checkpoint_bytes`, written by the driver under
``checkpoint_dir/update-<n>/`` and then named in ``manifest.json``, both
atomically). When a worker dies (``ray.kill``, a lost node), ``run``
replaces it, puts every worker back to the last checkpoint and replays the
updates since then, so the run ends with the bits of an undisturbed one
(the data must be a function of the update index). When the driver dies,
a new driver calls :meth:`DataParallel.restore` with the same directory
and continues.

```python
import numpy as np, ray
import braintrace_rs as bt
from braintrace_rs import nn
from braintrace_rs.distributed import DataParallel

def make_learner(batch):
    model = nn.Sequential(nn.GRUCell(3, 8), nn.Linear(8, 2, name="out"))
    return bt.compile(model, bt.D_RTRL(), np.zeros((batch, 3)), batch_size=batch)

ray.init(num_cpus=2)
dp = DataParallel(make_learner, lambda: bt.Adam(1e-2), batch_size=8, num_workers=2)
rng = np.random.default_rng(0)
losses = dp.step(rng.standard_normal((5, 8, 3)), rng.standard_normal((5, 8, 2)))
dp.shutdown()
```
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

try:
    import ray
    from ray.exceptions import RayActorError
except ImportError as e:  # pragma: no cover - exercised only without ray
    raise ImportError("braintrace_rs.distributed needs ray: pip install ray") from e

from . import checkpoint_bytes, restore_checkpoint_bytes

__all__ = ["DataParallel", "split_sizes", "MANIFEST"]

#: The name of the file that says which checkpoint is the last complete one.
MANIFEST = "manifest.json"

Arrays = Dict[str, np.ndarray]


def split_sizes(batch_size: int, num_workers: int) -> List[int]:
    """Shard sizes: ``batch_size`` streams over ``num_workers`` workers,
    consecutive, the first ``batch_size % num_workers`` one larger.
    ``ValueError`` naming the argument for zero workers, more workers than
    streams, or a batch below 1."""
    if not isinstance(num_workers, (int, np.integer)) or isinstance(num_workers, bool):
        raise TypeError(f"`num_workers`: expected an int, got {type(num_workers).__name__}")
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool):
        raise TypeError(f"`batch_size`: expected an int, got {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}")
    if num_workers < 1:
        raise ValueError(f"`num_workers` must be at least 1, got {num_workers}")
    if num_workers > batch_size:
        raise ValueError(
            f"`num_workers` ({num_workers}) is above `batch_size` ({batch_size}): "
            "every worker needs at least one stream"
        )
    q, r = divmod(int(batch_size), int(num_workers))
    return [q + 1 if i < r else q for i in range(int(num_workers))]


class _Shard:
    """One worker: a learner for a shard of the batch and its optimiser."""

    def __init__(self, make_learner, make_optimizer, batch: int, loss: Any, reduction: str) -> None:
        self.learner = make_learner(batch)
        if self.learner.batch_size != batch:
            raise ValueError(
                f"`make_learner({batch})` returned a learner for batch size {self.learner.batch_size}"
            )
        self.opt = make_optimizer()
        self.loss, self.reduction = loss, reduction

    def params(self) -> Arrays:
        return self.learner.params()

    def set_params(self, params: Arrays) -> None:
        self.learner.set_params(params)

    def grad(self, xs: np.ndarray, ys: np.ndarray) -> Tuple[Arrays, np.ndarray]:
        return self.learner.etrace_grad(xs, ys, self.loss, self.reduction)

    def apply(self, grads: Arrays) -> None:
        self.opt.step(self.learner, grads)

    def update(self, x: np.ndarray) -> np.ndarray:
        return self.learner.update(x)

    def checkpoint(self, counters: Dict[str, int]) -> bytes:
        return checkpoint_bytes(self.learner, self.opt, counters)

    def restore(self, blob: bytes) -> Dict[str, int]:
        return restore_checkpoint_bytes(self.learner, blob, self.opt)

    def pid(self) -> int:
        return os.getpid()


def _average(grads: Sequence[Arrays], weights: Sequence[float]) -> Arrays:
    """``Σ_i w_i g_i`` per key, in the gradients' dtype."""
    out = {}
    for k in grads[0]:
        acc = grads[0][k] * grads[0][k].dtype.type(weights[0])
        for g, w in zip(grads[1:], weights[1:]):
            acc = acc + g[k] * g[k].dtype.type(w)
        out[k] = acc
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DataParallel:
    """Data-parallel online learning of ``batch_size`` streams over
    ``num_workers`` Ray actors (see the module docs).

    ``make_learner(batch)`` returns a learner compiled for ``batch``
    streams (``braintrace_rs.compile(..., batch_size=batch)``) and
    ``make_optimizer()`` an optimiser (``SGD`` / ``Adam``); both are called
    inside the actors, so they must be picklable (functions and lambdas
    are). ``loss`` and ``reduction`` are ``etrace_grad``'s; the loss must be
    a mean over the batch for the shard-size weights to give the whole
    batch's gradient. ``cpus_per_worker`` is each actor's Ray CPU request.
    Ray must be initialised (``ray.init``) first.
    """

    def __init__(
        self,
        make_learner: Callable[[int], Any],
        make_optimizer: Callable[[], Any],
        batch_size: int,
        num_workers: int,
        loss: Any = "mse",
        reduction: str = "mean",
        cpus_per_worker: float = 1,
    ) -> None:
        self.sizes = split_sizes(batch_size, num_workers)
        if not ray.is_initialized():
            raise RuntimeError("braintrace_rs.distributed: call ray.init(...) first")
        self.batch_size, self.num_workers = int(batch_size), int(num_workers)
        self._spec = (make_learner, make_optimizer, loss, reduction)
        self._actor = ray.remote(num_cpus=cpus_per_worker, max_restarts=0)(_Shard)
        self.workers = [self._spawn(b) for b in self.sizes]
        #: Updates applied so far (what a checkpoint's ``update`` counts).
        self.updates = 0
        #: Workers replaced after a fault.
        self.replaced = 0
        self.checkpoint_dir: Optional[Path] = None
        self._last: Optional[Tuple[int, List[bytes]]] = None
        self._pending: List[Any] = []
        # Identical replicas: worker 0's parameters everywhere.
        p = ray.get(self.workers[0].params.remote())
        ray.get([w.set_params.remote(p) for w in self.workers[1:]])
        self.bytes_per_update = self._bytes(p)

    def _spawn(self, batch: int):
        make_learner, make_optimizer, loss, reduction = self._spec
        return self._actor.remote(make_learner, make_optimizer, batch, loss, reduction)

    @staticmethod
    def _bytes(params: Arrays) -> int:
        return sum(v.nbytes for v in params.values())

    def _bounds(self) -> List[Tuple[int, int]]:
        out, start = [], 0
        for b in self.sizes:
            out.append((start, start + b))
            start += b
        return out

    def _check_batch(self, name: str, a: np.ndarray, axis: int) -> np.ndarray:
        a = np.asarray(a)
        if a.ndim <= axis or a.shape[axis] != self.batch_size:
            raise ValueError(
                f"`{name}` {a.shape}: axis {axis} must be the batch ({self.batch_size} streams)"
            )
        return a

    def step(self, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """One update on ``xs`` ``(T, B, *input)``, ``ys`` ``(T, B, *target)``:
        every shard's gradients, their weighted average, the same optimiser
        step on every replica. Returns the per-step losses ``(T,)`` of the
        whole batch (the shard losses weighted like the gradients)."""
        xs, ys = self._check_batch("xs", xs, 1), self._check_batch("ys", ys, 1)
        refs = [
            w.grad.remote(np.ascontiguousarray(xs[:, a:b]), np.ascontiguousarray(ys[:, a:b]))
            for w, (a, b) in zip(self.workers, self._bounds())
        ]
        # The previous update's `apply` calls ran before these (an actor
        # runs its calls in order); their errors surface here.
        ray.get(self._pending)
        self._pending = []
        out = ray.get(refs)
        weights = [b / self.batch_size for b in self.sizes]
        avg = _average([g for g, _ in out], weights)
        losses = sum(l * l.dtype.type(w) for (_, l), w in zip(out, weights))
        ref = ray.put(avg)
        self._pending = [w.apply.remote(ref) for w in self.workers]
        self.updates += 1
        return losses

    def update(self, x: np.ndarray) -> np.ndarray:
        """One online step (no learning) on ``x`` ``(B, *input)``: the
        outputs of every stream, in order."""
        x = self._check_batch("x", x, 0)
        refs = [w.update.remote(np.ascontiguousarray(x[a:b])) for w, (a, b) in zip(self.workers, self._bounds())]
        return np.concatenate(ray.get(refs), axis=0)

    def params(self, worker: int = 0) -> Arrays:
        """A replica's parameters (all are the same)."""
        ray.get(self._pending)
        return ray.get(self.workers[worker].params.remote())

    def all_params(self) -> List[Arrays]:
        """Every replica's parameters (to check that they agree)."""
        ray.get(self._pending)
        return ray.get([w.params.remote() for w in self.workers])

    # -- checkpoints -------------------------------------------------------

    def checkpoint(self, checkpoint_dir: Optional[os.PathLike] = None) -> Path:
        """Save every worker's learner and optimiser after ``self.updates``
        updates under ``checkpoint_dir/update-<n>/``, then name it in
        ``manifest.json`` (written last, atomically: a crash while saving
        leaves the previous checkpoint the current one). Returns the
        directory of this checkpoint."""
        d = self._dir(checkpoint_dir)
        ray.get(self._pending)
        self._pending = []
        blobs = ray.get([w.checkpoint.remote({"update": self.updates}) for w in self.workers])
        sub = d / f"update-{self.updates:08d}"
        sub.mkdir(parents=True, exist_ok=True)
        for i, blob in enumerate(blobs):
            _write_atomic(sub / f"worker-{i}.ckpt", blob)
        manifest = {
            "update": self.updates,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "sizes": self.sizes,
            "dir": sub.name,
        }
        _write_atomic(d / MANIFEST, json.dumps(manifest).encode())
        for old in d.glob("update-*"):
            if old.name != sub.name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        self._last = (self.updates, blobs)
        return sub

    def _dir(self, checkpoint_dir: Optional[os.PathLike]) -> Path:
        if checkpoint_dir is not None:
            self.checkpoint_dir = Path(checkpoint_dir)
        if self.checkpoint_dir is None:
            raise ValueError("`checkpoint_dir`: no checkpoint directory given")
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self.checkpoint_dir

    def restore(self, checkpoint_dir: os.PathLike) -> int:
        """Put every worker back to the last complete checkpoint in
        ``checkpoint_dir`` (written by :meth:`checkpoint`, possibly by
        another driver that died) and return its update count. The
        checkpoint must be of the same ``batch_size`` and ``num_workers``
        (a ``ValueError`` naming the one that differs)."""
        d = Path(checkpoint_dir)
        path = d / MANIFEST
        if not path.exists():
            raise ValueError(f"`checkpoint_dir`: {d} holds no {MANIFEST}")
        m = json.loads(path.read_text())
        for key in ("batch_size", "num_workers"):
            if m[key] != getattr(self, key):
                raise ValueError(
                    f"`{key}`: the checkpoint in {d} was written with {key}={m[key]}, "
                    f"this run has {getattr(self, key)}"
                )
        blobs = [(d / m["dir"] / f"worker-{i}.ckpt").read_bytes() for i in range(self.num_workers)]
        self.checkpoint_dir = d
        self._load(m["update"], blobs)
        return self.updates

    def _load(self, update: int, blobs: List[bytes]) -> None:
        self._pending = []
        ray.get([w.restore.remote(b) for w, b in zip(self.workers, blobs)])
        self.updates = update
        self._last = (update, blobs)

    def _recover(self) -> None:
        """Replace the dead workers and put every worker back to the last
        checkpoint."""
        if self._last is None:
            raise RuntimeError("a worker died and there is no checkpoint to resume from")
        for i, w in enumerate(self.workers):
            try:
                ray.get(w.pid.remote())
            except RayActorError:
                self.workers[i] = self._spawn(self.sizes[i])
                self.replaced += 1
        self._load(*self._last)

    def run(
        self,
        data: Callable[[int], Tuple[np.ndarray, np.ndarray]],
        num_updates: int,
        checkpoint_every: int = 0,
        checkpoint_dir: Optional[os.PathLike] = None,
        max_recoveries: int = 3,
    ) -> List[np.ndarray]:
        """Run updates ``self.updates .. num_updates - 1``, update ``i`` on
        ``data(i)`` = ``(xs, ys)``. With ``checkpoint_every`` = K > 0, a
        checkpoint after every K-th update (and one before the first, so
        that there is always one to go back to); a worker that dies is
        replaced and the run goes back to the last checkpoint and replays
        from there (at most ``max_recoveries`` times). Returns the losses of
        the updates this call ran, by update (the last run of each)."""
        if checkpoint_every < 0:
            raise ValueError(f"`checkpoint_every` must be 0 or more, got {checkpoint_every}")
        if checkpoint_every:
            self._dir(checkpoint_dir)
            if self._last is None:
                self.checkpoint()
        start = self.updates
        losses: Dict[int, np.ndarray] = {}
        recoveries = 0
        while self.updates < num_updates:
            try:
                i = self.updates
                losses[i] = self.step(*data(i))
                if checkpoint_every and self.updates % checkpoint_every == 0:
                    self.checkpoint()
            except RayActorError:
                if not checkpoint_every or recoveries >= max_recoveries:
                    raise
                recoveries += 1
                self._recover()
        ray.get(self._pending)
        self._pending = []
        return [losses[i] for i in range(start, num_updates)]

    def shutdown(self) -> None:
        """Stop the workers."""
        for w in self.workers:
            ray.kill(w)
        self.workers = []
