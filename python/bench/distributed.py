"""Updates per second of braintrace_rs.distributed with 1 and 2 workers on
this machine, the bytes each update moves, and a paper estimate for 16 and
256 workers.

    python bench/distributed.py [--batch 16] [--hidden 64] [--steps 10] [--updates 30] [--quick]

The model is a GRU (3 inputs, ``--hidden`` units) with a linear readout
(2 outputs), D-RTRL, Adam; one update is ``etrace_grad`` over ``--steps``
time steps of the shard's streams plus the optimiser step. "in process" is
one learner on the whole batch, no Ray: the reference the workers are
compared to.

The estimate (weak scaling: each worker keeps ``--batch`` streams): an
update costs one learner's compute on ``--batch`` streams (measured in
process), plus one round trip (a no-op actor call that sends the
gradients and gets them back), plus the driver's own CPU per such call
times N (the calls' waiting overlaps, the driver's work does not), plus the
gradients' traffic through the driver's link, ``2 × N × P × itemsize``
bytes at ``--link-gbps`` (default 10 Gb/s).
"""

import argparse
import json
import time

import numpy as np
import ray

import braintrace_rs as bt
from braintrace_rs import nn
from braintrace_rs.distributed import DataParallel


class _Echo:
    def echo(self, x):
        return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--link-gbps", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.batch, a.hidden, a.steps, a.updates = 4, 16, 4, 5
    H = a.hidden

    def make_learner(batch):
        model = nn.Sequential(nn.GRUCell(3, H), nn.Linear(H, 2, name="out"))
        return bt.compile(model, bt.D_RTRL(non_temporal="in_step"), np.zeros((batch, 3), np.float32), batch_size=batch)

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((a.steps, a.batch, 3)).astype(np.float32)
    ys = rng.standard_normal((a.steps, a.batch, 2)).astype(np.float32)

    # In process: one learner on the whole batch.
    learner, opt = make_learner(a.batch), bt.Adam(1e-3)
    for _ in range(2):
        g, _ = learner.etrace_grad(xs, ys)
        opt.step(learner, g)
    t0 = time.perf_counter()
    for _ in range(a.updates):
        g, _ = learner.etrace_grad(xs, ys)
        opt.step(learner, g)
    t_proc = (time.perf_counter() - t0) / a.updates
    params = learner.params()
    p_count = sum(v.size for v in params.values())
    itemsize = next(iter(params.values())).itemsize
    rows = {"in process": {"updates_per_s": 1 / t_proc, "s_per_update": t_proc}}

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # What the driver pays per worker and update without any compute: the
    # gradients to an actor and back, through the object store.
    echo = ray.remote(num_cpus=1)(_Echo).remote()
    for _ in range(5):
        ray.get(echo.echo.remote(ray.put(params)))
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(50):
        ray.get(echo.echo.remote(ray.put(params)))
    latency = (time.perf_counter() - t0) / 50
    # The driver's own CPU per call: what N workers add one after another
    # (the waiting overlaps; the driver's work does not).
    overhead = (time.process_time() - c0) / 50
    ray.kill(echo)
    for n in (1, 2):
        dp = DataParallel(make_learner, lambda: bt.Adam(1e-3), batch_size=a.batch, num_workers=n)
        for _ in range(2):
            dp.step(xs, ys)
        dp.params()
        t0 = time.perf_counter()
        for _ in range(a.updates):
            dp.step(xs, ys)
        dp.params()  # waits for the last optimiser step
        t = (time.perf_counter() - t0) / a.updates
        moved = 2 * n * p_count * itemsize + xs.nbytes + ys.nbytes
        rows[f"{n} worker(s)"] = {"updates_per_s": 1 / t, "s_per_update": t, "bytes_per_update": moved}
        dp.shutdown()
    ray.shutdown()

    print(json.dumps({"batch": a.batch, "hidden": H, "steps": a.steps, "params": p_count, "itemsize": itemsize}))
    print(f"{'':14} {'updates/s':>10} {'ms/update':>10} {'bytes/update':>13}")
    for k, r in rows.items():
        b = r.get("bytes_per_update")
        print(f"{k:14} {r['updates_per_s']:10.1f} {1e3 * r['s_per_update']:10.2f} {b if b else '':>13}")

    # Paper estimate.
    link = a.link_gbps * 1e9 / 8
    print(
        f"\na no-op round trip with the gradients: {1e3 * latency:.2f} ms, "
        f"of which the driver's CPU {1e3 * overhead:.2f} ms (per worker)"
    )
    print(f"estimate at {a.link_gbps:g} Gb/s through the driver, the whole batch of {a.batch} streams kept per worker:")
    for n in (16, 256):
        compute = t_proc  # each worker keeps a whole batch: weak scaling
        traffic = 2 * n * p_count * itemsize / link
        est = compute + latency + n * overhead + traffic
        print(
            f"  N={n:4}: compute {1e3 * compute:.2f} ms + round trip {1e3 * latency:.2f} ms"
            f" + driver {1e3 * n * overhead:.2f} ms"
            f" + traffic {1e3 * traffic:.2f} ms = {1e3 * est:.2f} ms/update"
            f" ({n * a.batch / est:.0f} stream-updates/s vs {a.batch / t_proc:.0f} on one learner)"
        )


if __name__ == "__main__":
    main()
