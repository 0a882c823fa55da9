"""Search cost of snapshot-loaded collections (a shard per group of batches) beside an upserted one.

    python3 benches/snapshot_search.py REST_URL [QUERIES [COLLECTION...]]

For collections `upsert` and `snapshot` (as benches/snapshot_load.sh leaves them), or those
named (the first gives the queries): QUERIES
vectors of the collection as queries, one request at a time, HNSW search with the collection's
defaults (top 10): p50 / p95 latency and recall@10 against exact search. One JSON line.
"""
import json
import sys
import time
import urllib.request

rest = sys.argv[1].rstrip("/")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
collections = sys.argv[3:] or ["upsert", "snapshot"]


def call(method, path, body=None):
    req = urllib.request.Request(rest + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["result"]


queries = [p["vector"] for p in call("POST", f"/collections/{collections[0]}/points/scroll",
                                     {"limit": n, "with_vector": True, "offset": None})["points"]]
out = {"queries": len(queries)}
for c in collections:
    lat, hits = [], 0
    for q in queries:
        t = time.perf_counter()
        got = call("POST", f"/collections/{c}/points/query", {"query": q, "limit": 10})["points"]
        lat.append(time.perf_counter() - t)
        exact = call("POST", f"/collections/{c}/points/query",
                     {"query": q, "limit": 10, "params": {"exact": True}})["points"]
        hits += len({h["id"] for h in got} & {h["id"] for h in exact})
    lat.sort()
    info = call("GET", f"/collections/{c}")
    out[c] = {"p50_ms": round(1000 * lat[len(lat) // 2], 2),
              "p95_ms": round(1000 * lat[int(len(lat) * 0.95)], 2),
              "recall_at_10": round(hits / (10 * len(queries)), 4),
              "segments": info.get("segments_count")}
print(json.dumps(out))
