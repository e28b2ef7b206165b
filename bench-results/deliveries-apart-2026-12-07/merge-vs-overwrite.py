"""A delta-rs merge of one batch's ACKs against an overwrite-by-predicate of the same rows."""
import statistics, tempfile, time
import pyarrow as pa, pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

def batch(i, n=400):
    s = list(range(i * n, (i + 1) * n))
    return pa.table({"account": ["bob"] * n, "smuid": pa.array(s, pa.int64()), "status": ["pending"] * n,
                     "acked_at": pa.array([None] * n, pa.int64())})

def run(kind, batches=60):
    d = tempfile.mkdtemp()
    write_deltalake(d, batch(0))
    t = DeltaTable(d)
    times = []
    for i in range(1, batches):
        write_deltalake(t, batch(i), mode="append")
        acks = batch(i - 1).set_column(2, "status", pa.array(["acked"] * 400)).set_column(3, "acked_at", pa.array([i] * 400, pa.int64()))
        lo, hi = (i - 1) * 400, i * 400 - 1
        start = time.perf_counter()
        if kind == "merge":
            (t.merge(acks, predicate=f"t.account = s.account AND t.smuid = s.smuid AND t.smuid >= {lo} AND t.smuid <= {hi}",
                     source_alias="s", target_alias="t")
              .when_matched_update(updates={"status": "s.status", "acked_at": "s.acked_at"}, predicate="t.status = 'pending'")
              .execute())
        else:
            cur = t.to_pyarrow_table(filters=[("smuid", ">=", lo), ("smuid", "<=", hi)])
            # apply: here every row is acked
            new = cur.set_column(2, "status", pa.array(["acked"] * cur.num_rows)).set_column(3, "acked_at", pa.array([i] * cur.num_rows, pa.int64()))
            write_deltalake(t, new, mode="overwrite", predicate=f"smuid >= {lo} AND smuid <= {hi}")
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[10:]), sorted(times[10:])[int(len(times[10:]) * 0.9)]

for r in range(2):
    for kind in ("merge", "overwrite"):
        print(kind, "p50 %.1f p90 %.1f ms" % run(kind))
