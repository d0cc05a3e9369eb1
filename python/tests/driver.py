"""A driver process for the driver-fault test: connects to the test's Ray
cluster (argv[1]), runs data-parallel updates with a checkpoint every 2
into argv[2], and kills itself (SIGKILL, no clean-up) when it reaches
update argv[3]."""

import os
import signal
import sys

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_helpers as h  # noqa: E402

from braintrace_rs.distributed import DataParallel  # noqa: E402

address, ckpt_dir, die_at, total, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ray.cloudpickle.register_pickle_by_value(h)
ray.init(address=address)
dp = DataParallel(h.make_learner, h.make_adam, batch_size=batch, num_workers=2)


def data(i):
    if i == die_at:
        print(f"driver: killed at update {i}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return h.data(i, batch)


dp.run(data, total, checkpoint_every=2, checkpoint_dir=ckpt_dir)
print("driver: finished without being killed", flush=True)
