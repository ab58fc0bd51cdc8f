"""The readers of the epochs benchmark: what a training job does to its dataset, one epoch at a time.

Driven by benches/epochs (the harness), which starts this script inside the cgroups under test:

    readers.py --kind plain|torch|tvio|dali|dali_roi|view|shards --root DIR --epochs N --seed S

It prints one JSON line when set up ({"ready": ...}) and one after each epoch ({"epoch": ...}),
and before each epoch waits for a line on stdin, so the harness can take its measurements
between epochs without them counting in the epoch's time. Orders are seeded, so the page-cache
run and the prepfs run see exactly the same accesses.

- plain: every file read whole with open().read(), in a random permutation per epoch
  (`--order shuffled`), the same permutation every epoch (`fixed`), or walk order (`sorted`);
  `--think-ms` waits that long after each file, as a training step computes between samples;
  `--suffix .npy` reads a view's files instead of the JPEGs.
- torch: the stock torchvision ImageFolder + DataLoader (PIL, RandomResizedCrop(224), flip,
  ToTensor, Normalize; shuffle, `--batch-size` (32), `--workers` (2), persistent_workers),
  iterated to the end. Every DataLoader here keeps its workers between epochs: this bench's
  epochs are 2,000 images, and forking the workers again at each one cost ~10% of an epoch that
  ImageNet-sized ones (and DALI, which keeps its threads) never pay.
- tvio: the same with torchvision.io.decode_jpeg (libjpeg-turbo into a uint8 tensor) and the
  transforms v2 (RandomResizedCrop(224), flip, ToDtype float32, Normalize) in the workers.
- dali, dali_roi: NVIDIA DALI on the CPU (`device_id=None`, `--workers` threads):
  fn.readers.file (reshuffled whole after every epoch), then `dali` decodes the whole image
  (fn.decoders.image) and crops it (fn.random_resized_crop(224)), `dali_roi` decodes only a
  random crop (fn.decoders.image_random_crop, same area and aspect ranges) and resizes it to
  224x224; both flip and normalise to float32 CHW in fn.crop_mirror_normalize, and come out as
  torch tensors through DALIGenericIterator.
- view: the drop-in for `torch` over a prepfs tensor view: torchvision DatasetFolder over the
  view's .npy files with np.load as the loader, same DataLoader settings; the decode and the
  augmentation happen in the prepfs daemon.
- `--step-ms` (torch, tvio, dali*, view): the consumer computes that long per batch, as a training
  step on a device does while the loader works ahead; `--order-file FILE` (torch, tvio, view):
  the sampler shuffles like the DataLoader's and writes each epoch's paths to FILE before it
  starts (docs/CONFIGURATION.md's PublishedOrder), for a prepfs mount's `--order-file`.
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


# torchvision's Normalize constants (ImageNet), and the same on DALI's 0-255 scale.
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


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


def versions(*modules):
    """The versions of the imported `modules` that made this run's numbers, by module name."""
    return {m: getattr(sys.modules[m], "__version__", "?") for m in modules if m in sys.modules}


def step(args):
    """The consumer's work on one batch (`--step-ms`), as a device's training step."""
    if args.step_ms:
        time.sleep(args.step_ms / 1000.0)


def published_order(dataset, order_file, generator):
    """docs/CONFIGURATION.md's PublishedOrder: a shuffling sampler that writes its order first."""
    import torch

    class PublishedOrder(torch.utils.data.Sampler):
        def __len__(self):
            return len(dataset)

        def __iter__(self):
            order = torch.randperm(len(dataset), generator=generator).tolist()
            tmp = order_file + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(dataset.samples[i][0] + "\n" for i in order)
            os.replace(tmp, order_file)
            return iter(order)

    return PublishedOrder()


def dataset_epochs(args, dataset):
    """The epochs of a torchvision folder dataset through the stock DataLoader settings."""
    import torch
    from torch.utils.data import DataLoader

    nbytes = sum(os.path.getsize(path) for path, _ in dataset.samples)
    generator = torch.Generator().manual_seed(args.seed)
    settings = dict(batch_size=args.batch_size, num_workers=args.workers,
                    persistent_workers=args.workers > 0)
    if args.order_file:
        sampler = published_order(dataset, args.order_file, generator)
        loader = DataLoader(dataset, sampler=sampler, **settings)
    else:
        loader = DataLoader(dataset, shuffle=True, generator=generator, **settings)
    emit({"ready": True, "items": len(dataset),
          "versions": versions("torch", "torchvision", "numpy", "PIL")})
    for epoch in range(1, args.epochs + 1):
        wait_for_go()
        started, items = time.perf_counter(), 0
        for images, _labels in loader:
            items += images.shape[0]
            step(args)
        emit({"epoch": epoch, "seconds": time.perf_counter() - started,
              "items": items, "bytes": nbytes})


def torch_loader(args):
    from torchvision import datasets, transforms

    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=MEAN, std=STD),
    ])
    dataset_epochs(args, datasets.ImageFolder(args.root, transform=transform))


def tvio_loader(args):
    import torch
    from torchvision import datasets
    from torchvision.io import ImageReadMode, decode_jpeg, read_file
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.RandomResizedCrop(224, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=MEAN, std=STD),
    ])
    dataset_epochs(args, datasets.DatasetFolder(
        args.root, loader=lambda p: decode_jpeg(read_file(p), mode=ImageReadMode.RGB),
        extensions=(".jpg",), transform=transform))


def dali_loader(args, roi):
    """DALI's CPU pipeline; `roi`: decode only the random crop (fn.decoders.image_random_crop)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    # torchvision's RandomResizedCrop defaults, so every pipeline draws from the same crops.
    area, ratio = [0.08, 1.0], [3.0 / 4.0, 4.0 / 3.0]

    @pipeline_def(batch_size=args.batch_size, num_threads=args.workers, device_id=None,
                  seed=args.seed)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=args.root, shuffle_after_epoch=True,
                                        seed=args.seed, name="Reader")
        if roi:
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB, random_area=area,
                random_aspect_ratio=ratio, num_attempts=10)
            images = fn.resize(images, resize_x=224, resize_y=224)
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.random_resized_crop(images, size=224, random_area=area,
                                            random_aspect_ratio=ratio)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW",
            mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    pipe = pipeline()
    pipe.build()
    loader = DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader",
                                 last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
    emit({"ready": True, "items": pipe.epoch_size("Reader"),
          "versions": versions("nvidia.dali", "torch", "numpy")})
    for epoch in range(1, args.epochs + 1):
        wait_for_go()
        started, items = time.perf_counter(), 0
        for batch in loader:
            items += batch[0]["images"].shape[0]
            step(args)
        emit({"epoch": epoch, "seconds": time.perf_counter() - started, "items": items})


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
    parser.add_argument("--kind", required=True,
                        choices=["plain", "torch", "tvio", "dali", "dali_roi", "view", "shards"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--order", choices=["shuffled", "fixed", "sorted"], default="shuffled")
    parser.add_argument("--think-ms", type=float, default=0.0)
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="torch, tvio, dali*, view: the consumer's compute per batch")
    parser.add_argument("--order-file", help="torch, tvio, view: publish each epoch's order here")
    parser.add_argument("--suffix", default=".jpg", help="plain: the files to read")
    parser.add_argument("--batch-size", type=int, default=32, help="torch, tvio, dali*, view")
    parser.add_argument("--workers", type=int, default=2,
                        help="DataLoader workers (torch, tvio, view) or DALI threads")
    args = parser.parse_args()
    {"plain": plain, "torch": torch_loader, "tvio": tvio_loader,
     "dali": lambda a: dali_loader(a, roi=False), "dali_roi": lambda a: dali_loader(a, roi=True),
     "view": view_loader, "shards": shards}[args.kind](args)


if __name__ == "__main__":
    main()
