"""The readers of the epochs benchmark: what a training job does to its dataset, one epoch at a time.

Driven by benches/epochs (the harness), which starts this script inside the cgroups under test:

    readers.py --kind plain|torch|view|shards --root DIR --epochs N --seed S

It prints one JSON line when set up ({"ready": ...}) and one after each epoch ({"epoch": ...}),
and before each epoch waits for a line on stdin, so the harness can take its measurements
between epochs without them counting in the epoch's time. Orders are seeded, so the page-cache
run and the prepfs run see exactly the same accesses.

- plain: every file read whole with open().read(), in a random permutation per epoch
  (`--order shuffled`), the same permutation every epoch (`fixed`), or walk order (`sorted`);
  `--think-ms` waits that long after each file, as a training step computes between samples;
  `--suffix .npy` reads a view's files instead of the JPEGs.
- torch: the stock torchvision ImageFolder + DataLoader (RandomResizedCrop, flip, ToTensor,
  Normalize; batch 32, shuffle, num_workers=2), iterated to the end.
- view: the drop-in for `torch` over a prepfs tensor view: torchvision DatasetFolder over the
  view's .npy files with np.load as the loader, same DataLoader settings; the decode and the
  augmentation happen in the prepfs daemon.
- shards: WebDataset-style tar shards, each streamed member by member with tarfile, in a shuffled
  shard order per epoch (or `--order sorted|fixed`).
"""

import argparse
import json
import os
import random
import sys
import tarfile
import time


def emit(record):
    print(json.dumps(record), flush=True)


def wait_for_go():
    if not sys.stdin.readline():
        sys.exit(0)  # the harness went away


def files_under(root, suffix):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(suffix))
    return found


def epoch_order(args, paths, epoch):
    """The paths in the order this epoch reads them."""
    order = list(paths)
    if args.order == "shuffled":
        random.Random(args.seed * 1000 + epoch).shuffle(order)
    elif args.order == "fixed":
        random.Random(args.seed * 1000).shuffle(order)
    return order


def plain(args):
    paths = files_under(args.root, args.suffix)
    emit({"ready": True, "items": len(paths)})
    think = args.think_ms / 1000.0
    for epoch in range(1, args.epochs + 1):
        wait_for_go()
        order = epoch_order(args, paths, epoch)
        started, nbytes = time.perf_counter(), 0
        for path in order:
            with open(path, "rb") as f:
                nbytes += len(f.read())
            if think:
                time.sleep(think)
        emit({"epoch": epoch, "seconds": time.perf_counter() - started,
              "items": len(order), "bytes": nbytes})


def dataset_epochs(args, dataset):
    """The epochs of a torchvision folder dataset through the stock DataLoader settings."""
    import torch
    from torch.utils.data import DataLoader

    nbytes = sum(os.path.getsize(path) for path, _ in dataset.samples)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(args.seed))
    emit({"ready": True, "items": len(dataset)})
    for epoch in range(1, args.epochs + 1):
        wait_for_go()
        started, items = time.perf_counter(), 0
        for images, _labels in loader:
            items += images.shape[0]
        emit({"epoch": epoch, "seconds": time.perf_counter() - started,
              "items": items, "bytes": nbytes})


def torch_loader(args):
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    dataset_epochs(args, datasets.ImageFolder(args.root, transform=transform))


def view_loader(args):
    import numpy as np
    import torch
    from torchvision import datasets

    dataset_epochs(args, datasets.DatasetFolder(
        args.root, loader=lambda p: torch.from_numpy(np.load(p)), extensions=(".npy",)))


def shards(args):
    paths = files_under(args.root, ".tar")
    emit({"ready": True, "items": len(paths)})
    for epoch in range(1, args.epochs + 1):
        wait_for_go()
        order = epoch_order(args, paths, epoch)
        started, items, nbytes = time.perf_counter(), 0, 0
        for path in order:
            with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    if member.isfile():
                        nbytes += len(tar.extractfile(member).read())
                        items += 1
        emit({"epoch": epoch, "seconds": time.perf_counter() - started,
              "items": items, "bytes": nbytes})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["plain", "torch", "view", "shards"], required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--order", choices=["shuffled", "fixed", "sorted"], default="shuffled")
    parser.add_argument("--think-ms", type=float, default=0.0)
    parser.add_argument("--suffix", default=".jpg", help="plain: the files to read")
    args = parser.parse_args()
    {"plain": plain, "torch": torch_loader, "view": view_loader, "shards": shards}[args.kind](args)


if __name__ == "__main__":
    main()
