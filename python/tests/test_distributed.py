"""braintrace_rs.distributed on a local Ray cluster with 2 CPUs.

Equivalence: N=2 workers on B/N streams each end, after K updates, with
the parameters of one learner on all B streams (f64 to 1e-12, f32 to
1e-6), every replica with the same bits; an uneven split (5 streams over 2
workers) with the gradients weighted by shard size. Faults: a worker killed
mid-run (``ray.kill``) is replaced from the last checkpoint and the run
ends with the bits of an undisturbed run; a driver killed mid-run
(SIGKILL of a subprocess driver) is resumed from its checkpoint by a new
driver, with the same result. Bad input: zero workers, more workers than
streams, a checkpoint of another worker count."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("BRAINTRACE_REQUIRE_RAY", "") not in ("", "0"):
    import ray  # CI (.ci/run): a missing ray is a failure there
else:
    ray = pytest.importorskip("ray")

import dist_helpers as h  # noqa: E402

from braintrace_rs.distributed import DataParallel, split_sizes  # noqa: E402

K = 3 if h.QUICK else 6


@pytest.fixture(scope="module")
def cluster():
    ray.cloudpickle.register_pickle_by_value(h)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def same_bits(a, b):
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a
    )


def run_parallel(batch, workers, dtype="float64", algo="d_rtrl", n=K):
    dp = DataParallel(
        lambda b: h.make_learner(b, dtype, algo), h.make_adam, batch_size=batch, num_workers=workers
    )
    start = dp.params()
    for i in range(n):
        dp.step(*h.data(i, batch, dtype))
    replicas = dp.all_params()
    dp.shutdown()
    return start, replicas


@pytest.mark.parametrize(
    "dtype, algo, tol",
    [("float64", "d_rtrl", 1e-12), ("float32", "d_rtrl", 1e-6), ("float64", "pp_prop", 1e-12)],
)
def test_two_workers_end_with_the_parameters_of_one_learner(cluster, dtype, algo, tol):
    start, replicas = run_parallel(4, 2, dtype, algo)
    assert all(same_bits(r, replicas[0]) for r in replicas), "replicas differ"
    ref = h.reference(4, K, start, dtype, algo)
    assert max_diff(replicas[0], ref) <= tol
    # The parameters moved (the comparison is not of two starting points).
    assert max_diff(replicas[0], start) > 1e-4


def test_an_uneven_split_weights_the_average_by_shard_size(cluster):
    assert split_sizes(5, 2) == [3, 2]
    start, replicas = run_parallel(5, 2)
    assert all(same_bits(r, replicas[0]) for r in replicas)
    ref = h.reference(5, K, start)
    assert max_diff(replicas[0], ref) <= 1e-12


def test_a_killed_worker_is_replaced_from_the_last_checkpoint(cluster, tmp_path):
    batch, n = 4, K + 2
    calm = DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=2)
    calm.run(lambda i: h.data(i, batch), n, checkpoint_every=2, checkpoint_dir=tmp_path / "calm")
    expected = calm.params()
    calm.shutdown()

    dp = DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=2)
    killed = []

    def data(i):
        if i == n - 2 and not killed:
            killed.append(ray.get(dp.workers[1].pid.remote()))
            ray.kill(dp.workers[1])
        return h.data(i, batch)

    dp.run(data, n, checkpoint_every=2, checkpoint_dir=tmp_path / "faulty")
    assert killed and dp.replaced == 1
    assert ray.get(dp.workers[1].pid.remote()) != killed[0], "a new worker process"
    replicas = dp.all_params()
    dp.shutdown()
    assert all(same_bits(r, expected) for r in replicas)


def test_a_dead_driver_is_resumed_from_its_checkpoint(cluster, tmp_path):
    batch, n, die_at = 4, K + 2, K + 1
    ckpt = tmp_path / "ckpt"
    driver = Path(__file__).with_name("driver.py")
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", ""))
    p = subprocess.run(
        [sys.executable, str(driver), cluster, str(ckpt), str(die_at), str(n), str(batch)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in env.items() if v},
    )
    assert p.returncode == -9, p.stdout + p.stderr
    assert f"killed at update {die_at}" in p.stdout

    dp = DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=2)
    assert dp.restore(ckpt) == die_at - die_at % 2
    dp.run(lambda i: h.data(i, batch), n, checkpoint_every=2)
    resumed = dp.all_params()
    dp.shutdown()

    calm = DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=2)
    calm.run(lambda i: h.data(i, batch), n)
    expected = calm.params()
    calm.shutdown()
    assert all(same_bits(r, expected) for r in resumed)

    # A checkpoint of another worker count is refused by name.
    other = DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=1)
    with pytest.raises(ValueError, match="num_workers"):
        other.restore(ckpt)
    other.shutdown()


@pytest.mark.parametrize(
    "batch, workers, match",
    [(4, 0, "`num_workers` must be at least 1"), (4, 5, r"`num_workers` \(5\) is above `batch_size` \(4\)"), (0, 1, "`batch_size`")],
)
def test_bad_worker_counts_are_refused_by_name(batch, workers, match):
    with pytest.raises(ValueError, match=match):
        split_sizes(batch, workers)
    with pytest.raises(ValueError, match=match):
        DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=workers)
