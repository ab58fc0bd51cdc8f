"""The GPU benchmark of issue 8: images/s of a training view read by a PyTorch DataLoader,
side by side in one run:

  --prepfs LABEL MNT PID   (repeated) DataLoader over MNT/.prepfs/views/train, served by the
                           prepfs daemon PID (check.sh: prepfs-gpu with --gpu on, prepfs-cpu
                           with --gpu off, and prepfs-gpu-baseline for an older build)
  torchvision-gpu          DataLoader of raw JPEG bytes, then torchvision.io.decode_jpeg(
                           device='cuda') and v2 RandomResizedCrop(224) + RandomHorizontalFlip +
                           Normalize on the GPU

Each pipeline runs one warm-up epoch, then a timed epoch; CPU seconds are read from /proc for
the loader (with its workers) and for the prepfs daemon. Writes JSON to --out and prints a
Markdown table. Run by benches/gpu/check.sh, which pins everything to --cores.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torchvision
from torchvision.transforms import v2


def cpu_seconds(pid):
    """utime + stime of a process and its reaped children, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu(pid):
    total = 0.0
    for task in os.listdir("/proc"):
        if task.isdigit():
            try:
                with open(f"/proc/{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    total += cpu_seconds(int(task))
            except (OSError, IndexError, ValueError):
                pass
    return total


class Npy(torch.utils.data.Dataset):
    def __init__(self, root):
        self.paths = sorted(
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".npy")
        )

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.from_numpy(np.load(self.paths[i]))


class Jpeg(torch.utils.data.Dataset):
    def __init__(self, root):
        self.paths = sorted(
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".jpg")
        )

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        # A numpy array travels to the loader by value: a batch of tensors would take a file
        # descriptor each, and 256 of them in flight ran out of descriptors (EBADF on dup).
        return np.fromfile(self.paths[i], dtype=np.uint8)


def loader(dataset, args, collate=None):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch,
        num_workers=args.workers,
        shuffle=True,
        persistent_workers=True,
        collate_fn=collate,
        pin_memory=True,
    )


def epoch(batches, consume):
    n, started = 0, time.perf_counter()
    for batch in batches:
        n += consume(batch)
    torch.cuda.synchronize()
    return n, time.perf_counter() - started


def measure(name, batches, consume, daemon=None):
    epoch(batches, consume)  # warm-up: source into the cache, workers started
    me = os.getpid()
    cpu0 = cpu_seconds(me) + children_cpu(me)
    d0 = cpu_seconds(daemon) if daemon else 0.0
    n, secs = epoch(batches, consume)
    loader_cpu = cpu_seconds(me) + children_cpu(me) - cpu0
    daemon_cpu = (cpu_seconds(daemon) - d0) if daemon else 0.0
    return {
        "pipeline": name,
        "images": n,
        "seconds": secs,
        "images_per_s": n / secs,
        "loader_cpu_ms_per_image": 1e3 * loader_cpu / n,
        "prepfs_cpu_ms_per_image": 1e3 * daemon_cpu / n,
        "cpu_ms_per_image": 1e3 * (loader_cpu + daemon_cpu) / n,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--images", required=True)
    p.add_argument("--prepfs", nargs=3, action="append", default=[], metavar=("LABEL", "MNT", "PID"))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dev = torch.device("cuda")

    def to_gpu(batch):
        batch.to(dev, non_blocking=True)
        return batch.shape[0]

    runs = []
    for name, mnt, pid in args.prepfs:
        ds = Npy(os.path.join(mnt, ".prepfs/views/train"))
        runs.append(measure(name, loader(ds, args), to_gpu, daemon=int(pid)))
        print(json.dumps(runs[-1]), flush=True)

    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(3, 1, 1)
    augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def decode_on_gpu(batch):
        images = torchvision.io.decode_jpeg([torch.from_numpy(b) for b in batch], device=dev)
        out = torch.stack([augment(im) for im in images]).float().div_(255).sub_(mean).div_(std)
        return out.shape[0]

    ds = Jpeg(args.images)
    runs.append(measure("torchvision-gpu", loader(ds, args, collate=list), decode_on_gpu))
    print(json.dumps(runs[-1]), flush=True)

    with open(args.out, "w") as f:
        json.dump(runs, f, indent=2)
    cpu_path = next((r for r in runs if r["pipeline"] == "prepfs-cpu"), None)
    print(f"\n{args.workers} DataLoader workers, batches of {args.batch}")
    print("| pipeline | images/s | CPU ms/image (all) | prepfs CPU ms/image | vs prepfs-cpu CPU cost |")
    print("|---|---|---|---|---|")
    for r in runs:
        share = f"{100 * r['cpu_ms_per_image'] / cpu_path['cpu_ms_per_image']:.0f}%" if cpu_path else "-"
        print(
            f"| {r['pipeline']} | {r['images_per_s']:.0f} | {r['cpu_ms_per_image']:.3f} "
            f"| {r['prepfs_cpu_ms_per_image']:.3f} | {share} |"
        )


if __name__ == "__main__":
    main()
