#!/usr/bin/env python3
"""The Python peer of `embedfleet upload`: the same run's points into the same Qdrant server
with the official `qdrant-client` at its best settings (upload_collection with numpy arrays,
gRPC), so that both are measured in one sitting (BENCHMARKS.md, "Server figures").

    pip install qdrant-client pyarrow numpy
    python3 benches/qdrant_python.py RUN_DIR http://127.0.0.1:6334 [BATCH] [PARALLEL]

The clock starts after the shards are read into numpy (reading parquet is not charged to the
client) and stops when `upload_collection` returns (wait=True on every batch, as embedfleet).
The collection gets the uploader's settings (cosine, year/source indexes, HNSW deferred) and is
dropped at the end.
"""

import os
import sqlite3
import sys
import time
import uuid
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
from qdrant_client import QdrantClient, models

# uuid5(NAMESPACE_URL, "embedfleet:paper-id"): the uploader's point ids (jobs/src/upload/points.rs).
PAPER_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "embedfleet:paper-id")
COLLECTION = "python_client"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    run, url = sys.argv[1], sys.argv[2]
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    parallel = int(sys.argv[4]) if len(sys.argv) > 4 else 1

    paths = [p for (p,) in sqlite3.connect(os.path.join(run, "run.db")).execute(
        "SELECT path FROM shards ORDER BY batch_id, part")]
    tables = [pq.read_table(os.path.join(run, p)) for p in paths]
    vectors = np.concatenate([
        np.asarray(t.column("embedding").combine_chunks().flatten(), dtype=np.float32)
        .reshape(len(t), -1) for t in tables])
    ids, payload = [], []
    for t in tables:
        for pid, created, source, n_chars, n_tokens in zip(
                *(t.column(c).to_pylist() for c in ("id", "created", "source", "n_chars", "n_tokens"))):
            ids.append(str(uuid.uuid5(PAPER_NAMESPACE, pid)))
            payload.append({"paper_id": pid, "year": int(created[:4]) if created else None,
                            "source": source, "n_chars": n_chars, "n_tokens": n_tokens})
    n, dim = vectors.shape

    u = urlparse(url)
    client = QdrantClient(host=u.hostname, grpc_port=u.port or 6334, prefer_grpc=True, timeout=120,
                          check_compatibility=False)
    if client.collection_exists(COLLECTION):
        client.delete_collection(COLLECTION)
    client.create_collection(
        COLLECTION,
        vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE),
        hnsw_config=models.HnswConfigDiff(m=0),
        optimizers_config=models.OptimizersConfigDiff(indexing_threshold=0),
    )
    client.create_payload_index(COLLECTION, "year", models.PayloadSchemaType.INTEGER)
    client.create_payload_index(COLLECTION, "source", models.PayloadSchemaType.KEYWORD)

    start = time.perf_counter()
    client.upload_collection(COLLECTION, vectors=vectors, payload=payload, ids=ids,
                             batch_size=batch, parallel=parallel, wait=True)
    elapsed = time.perf_counter() - start
    count = client.count(COLLECTION, exact=True).count
    print(f"python qdrant-client: {n} points of {dim}-d, batch {batch}, parallel {parallel}: "
          f"{elapsed:.2f} s, {n / elapsed:.0f} points/s, {n * dim * 4 / 1e6 / elapsed:.1f} MB/s "
          f"(count {count})")
    client.delete_collection(COLLECTION)


if __name__ == "__main__":
    main()
