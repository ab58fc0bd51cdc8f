"""WebDataset over tar shards in a prepfs mount: sequential shard reads, shuffled in memory.

With --source, first packs the JPEGs under SOURCE/images/CLASS/ into SOURCE/shards/*.tar (sample
key CLASS/NAME, members .jpg and .cls) if no shards are there; the mount shows them at once.
"""
import glob
import io
import os
import sys
import tarfile

import torch
import webdataset as wds
from torchvision import transforms

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

SHARDS = 2


def pack(source):
    """SOURCE/images/CLASS/*.jpg into SHARDS tar shards, samples dealt round robin."""
    out = os.path.join(source, "shards")
    if glob.glob(os.path.join(out, "*.tar")):
        return
    classes = sorted(os.listdir(os.path.join(source, "images")))
    samples = sorted(glob.glob(os.path.join(source, "images", "*", "*.jpg")))
    os.makedirs(out, exist_ok=True)
    tars = [tarfile.open(os.path.join(out, f"train-{i:04d}.tar"), "w") for i in range(SHARDS)]
    for n, path in enumerate(samples):
        cls = os.path.basename(os.path.dirname(path))
        key = f"{cls}/{os.path.splitext(os.path.basename(path))[0]}"
        for ext, data in (("jpg", open(path, "rb").read()), ("cls", str(classes.index(cls)).encode())):
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            tars[n % SHARDS].addfile(info, io.BytesIO(data))
    for t in tars:
        t.close()


args = arguments(__doc__)
if args.source:
    pack(args.source)
urls = sorted(glob.glob(os.path.join(args.mount, "shards", "*.tar")))
assert len(urls) == SHARDS, urls
transform = transforms.Compose([transforms.RandomResizedCrop(64), transforms.ToTensor()])
dataset = (
    wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
    .shuffle(64)
    .decode("pil")
    .to_tuple("jpg", "cls")
    .map_tuple(transform, int)
)
# One worker per shard: WebDataset gives each worker its own shards.
loader = torch.utils.data.DataLoader(dataset.batched(16), batch_size=None, num_workers=SHARDS)
timer = Timer("webdataset")
expected = len(glob.glob(os.path.join(args.mount, "images", "*", "*.jpg")))
for epoch in range(args.epochs):
    seen = 0
    for images, labels in loader:
        assert images.shape[1:] == (3, 64, 64), images.shape
        seen += len(labels)
    assert seen == expected, f"epoch {epoch}: {seen} samples, expected {expected}"
    timer.add(seen)
timer.report(args.mount)
