import statistics, tempfile, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
def batch(i, n=400):
    s = list(range(i * n, (i + 1) * n))
    return pa.table({"account": ["bob"] * n, "smuid": pa.array(s, pa.int64()), "status": ["pending"] * n,
                     "acked_at": pa.array([None] * n, pa.int64()), "retries": pa.array([None]*n, pa.int32()), "is_new": [False]*n})
def run(many, batches=50):
    d = tempfile.mkdtemp(); write_deltalake(d, batch(0).drop(["is_new"])); t = DeltaTable(d); times = []
    for i in range(1, batches):
        write_deltalake(t, batch(i).drop(["is_new"]), mode="append")
        acks = batch(i - 1).set_column(2, "status", pa.array(["acked"] * 400)).set_column(3, "acked_at", pa.array([i] * 400, pa.int64()))
        lo, hi = (i - 1) * 400, i * 400 - 1
        start = time.perf_counter()
        m = t.merge(acks, predicate=f"t.account = s.account AND t.smuid = s.smuid AND t.smuid >= {lo} AND t.smuid <= {hi}", source_alias="s", target_alias="t")
        m = m.when_matched_update(updates={"status": "s.status", "acked_at": "s.acked_at"}, predicate="s.status = 'acked' AND t.status NOT IN ('acked','expired')")
        if many:
            for st in ("expired","trashed","retry","released","cleared","routed","waiting","removed"):
                m = m.when_matched_update(updates={"status": "s.status", "retries": "s.retries"}, predicate=f"s.status = '{st}' AND t.status = 'pending'")
            m = m.when_not_matched_insert(updates={c: f"s.{c}" for c in ("account","smuid","status","acked_at","retries")}, predicate="s.is_new")
        m.execute()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[10:])
for r in range(3):
    for many in (False, True):
        print("many" if many else "one ", "p50 %.1f ms" % run(many))
