"""Skip really skips: on a 2-worker cluster, the step functions of model.fit and of a custom loop execute
no collective at all on non-sync steps (counted from the ops TensorFlow's debugger saw execute, not from
the traced graph), and do on the sync step."""

ORDER = (
    "fit_local_1",
    "fit_sync",
    "fit_local_2",
    "custom_sync_1",
    "custom_local_1",
    "custom_sync_2",
    "custom_local_2",
)


def test_no_collective_executes_between_syncs(sc_cluster_again):
    per_worker = [g["stages"] for g in sc_cluster_again.results("collectives")]
    for w, stages in enumerate(per_worker):
        assert set(stages) == set(ORDER), stages
        for name in ("fit_local_1", "fit_local_2", "custom_local_1", "custom_local_2"):
            assert stages[name]["collectives"] == {}, (w, name, stages[name])
        # the sync step: the fused all-reduce of the model (metrics stay local inside the step functions)
        for name in ("fit_sync", "custom_sync_1", "custom_sync_2"):  # one fused all-reduce (one dtype)
            assert stages[name]["collectives"] == {"CollectiveReduceV2": 1}, (w, name, stages[name])
        assert [stages[s]["syncs"] for s in ORDER] == [0, 1, 1, 2, 2, 3, 3]
    # the epoch's loss and accuracy Keras returns are global: the same on both workers (their data differ)
    for name in ("fit_local_1", "fit_sync", "fit_local_2"):
        assert per_worker[0][name]["history"] == per_worker[1][name]["history"], name
