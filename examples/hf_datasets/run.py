"""Hugging Face datasets over Arrow and Parquet files in a prepfs mount, offline.

Dataset.from_file memory-maps an Arrow file straight from the mount (mmap through FUSE); the
Parquet file is loaded with load_dataset("parquet"), which reads it from the mount and writes its
Arrow cache elsewhere (a temporary directory here). With --source, first writes
SOURCE/table/{data.arrow,data.parquet} (ROWS rows of an id and a 64-float vector) if missing.
"""
import os
import sys
import tempfile

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from datasets import Dataset, load_dataset  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

ROWS = 20_000


def make(source):
    out = os.path.join(source, "table")
    if os.path.exists(os.path.join(out, "data.parquet")):
        return
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((ROWS, 64), dtype=np.float32)
    table = pa.table({
        "id": pa.array(np.arange(ROWS, dtype=np.int64)),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 64),
    })
    # datasets memory-maps the Arrow IPC stream format.
    with pa.OSFile(os.path.join(out, "data.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1024)
    pq.write_table(table, os.path.join(out, "data.parquet"), row_group_size=2048)


args = arguments(__doc__)
if args.source:
    make(args.source)
table = os.path.join(args.mount, "table")
timer = Timer("hf_datasets")
for epoch in range(args.epochs):
    arrow = Dataset.from_file(os.path.join(table, "data.arrow")).with_format("numpy")
    ids = 0
    # The mount is read-only: datasets would write the shuffle's index file beside the data
    # file, so keep it in memory (or give indices_cache_file_name a writable path).
    for batch in arrow.shuffle(seed=epoch, keep_in_memory=True).iter(batch_size=512):
        assert batch["vector"].shape[1:] == (64,), batch["vector"].shape
        ids += int(batch["id"].sum())
    assert ids == ROWS * (ROWS - 1) // 2, ids
    timer.add(len(arrow))
with tempfile.TemporaryDirectory() as cache:
    parquet = load_dataset(
        "parquet", data_files=os.path.join(table, "data.parquet"), split="train", cache_dir=cache)
    assert len(parquet) == ROWS and parquet[ROWS - 1]["id"] == ROWS - 1
    timer.add(len(parquet))
timer.report(args.mount)
