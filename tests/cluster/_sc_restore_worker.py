"""One worker of the 2-worker save/restore cluster test (started by tf_commopt.cluster.run_cluster).

Usage: python tests/cluster/_sc_restore_worker.py OUT_DIR first|resume
``first``: SAVE_AT steps of softmax regression (H = 3, vrl, this worker's own data), ``strategy.sync()``,
a checkpoint (every worker writes: Δ of both workers is gathered; worker i into ckpt{i}), then the
remaining steps. ``resume``: a new cluster restores ckpt0 (the chief's) and takes the remaining steps.
Both record this worker's copy of the variables and its Δ after every step after the save.
"""

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.tf.sc_reference import make_batches, softmax_step  # noqa: E402
from tf_commopt.distribute import SkipCorrectStrategy  # noqa: E402

R, B, F, C, LR, H, STEPS, SAVE_AT = 2, 5, 3, 4, 0.2, 3, 10, 4


def main(out_dir: str, mode: str) -> None:
    strategy = SkipCorrectStrategy(interval=H, correction="vrl")
    assert strategy.num_replicas_in_sync == R, strategy.num_replicas_in_sync
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    rng = np.random.RandomState(7)
    w0, b0 = rng.randn(F, C).astype(np.float32) * 0.3, rng.randn(C).astype(np.float32) * 0.1
    batches = make_batches(STEPS, R, B, F, C, seed=17)
    with strategy.scope():
        w = tf.Variable(w0 if mode == "first" else np.zeros_like(w0))
        b = tf.Variable(b0 if mode == "first" else np.zeros_like(b0))
        opt = tf.keras.optimizers.SGD(LR)
    ckpt = tf.train.Checkpoint(optimizer=opt, w=w, b=b)

    step = softmax_step(strategy, w, b, opt, R * B)

    def run(rows):
        ws, bs, ds = [], [], []
        for row in rows:
            step(row)
            ws.append(w.values[0].numpy())
            bs.append(b.values[0].numpy())
            ds.append(strategy.extended.correction_state(opt).delta_numpy()[0][0])
        return ws, bs, ds

    saved = {}
    if mode == "first":
        run(batches[:SAVE_AT])
        saved["d_saved"] = strategy.extended.correction_state(opt).delta_numpy()[0][0]
        strategy.sync()  # the model users see is the global model: average before the checkpoint
        ckpt.write(os.path.join(out_dir, f"ckpt{task}", "ckpt"))
    else:
        ckpt.restore(os.path.join(out_dir, "ckpt0", "ckpt"))  # Δ_i and k: deferred to the first step
    ws, bs, ds = run(batches[SAVE_AT:])
    np.savez(
        os.path.join(out_dir, f"{mode}{task}.npz"),
        w=np.stack(ws),
        b=np.stack(bs),
        d=np.stack(ds),
        iterations=int(opt.iterations.numpy()),
        syncs=strategy.stats()["syncs"],
        **saved,
    )
    print("done", mode, task, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
