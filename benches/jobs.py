"""Coordinated prep: N training jobs started together over one prepfs view (issue 35).

Usage (root, from the repository, with the environment python/ensure-env prepares):
  python benches/jobs.py --prepfs target/release/prepfs --images DIR [--jobs 1,3] [--epochs 3]
      [--view 'train=decode,random_resized_crop(224),hflip,uint8'] [--workers 2] [--rounds 2]

DIR holds the JPEGs (any tree). For each round and each job count, in turn, it mounts DIR with
the given prepfs binary (`--decoded-cache off`, so every open renders from the encoded file),
starts that many jobs at once, each a DataLoader with --workers worker processes reading
--epochs shuffled epochs of the view through np.load, and reports per run: aggregate images/s,
renders per epoch against the file count, shared hits, and the daemon's and the jobs' CPU per
image. Comparing binaries (before and after) means running it once per binary, interleaved.
Prints one Markdown table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

JOB = r"""
import sys, time, numpy as np, torch, torchvision
from torch.utils.data import DataLoader
root, epochs, workers, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ds = torchvision.datasets.DatasetFolder(root, loader=lambda p: torch.from_numpy(np.load(p)),
                                        extensions=(".npy",))
dl = DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers,
                generator=torch.Generator().manual_seed(seed))
start = time.monotonic()
n = 0
for _ in range(epochs):
    for x, _ in dl:
        n += x.shape[0]
print(n, time.monotonic() - start)
"""


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    usage = os.times()
    return usage.children_user + usage.children_system


def run(args, jobs, work):
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    daemon = subprocess.Popen([args.prepfs, "mount", args.images, mnt, "--foreground",
                               "--decoded-cache", "off", "--view", args.view],
                              stdout=subprocess.DEVNULL)
    try:
        stats = os.path.join(mnt, ".prepfs", "stats.json")
        deadline = time.monotonic() + 30
        while not os.path.exists(stats):
            if time.monotonic() > deadline or daemon.poll() is not None:
                sys.exit("prepfs did not mount")
            time.sleep(0.05)
        name = args.view.split("=", 1)[0]
        root = os.path.join(mnt, ".prepfs", "views", name)
        files = sum(1 for _, _, fs in os.walk(root) for f in fs if f.endswith(".npy"))
        cpu0, kids0, t0 = cpu_seconds(daemon.pid), children_cpu(), time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", JOB, root, str(args.epochs),
                                   str(args.workers), str(j + 1)], stdout=subprocess.PIPE,
                                  text=True) for j in range(jobs)]
        outs = [p.communicate()[0].split() for p in procs]
        wall = time.monotonic() - t0
        if any(p.returncode for p in procs):
            sys.exit("a job failed")
        daemon_cpu = cpu_seconds(daemon.pid) - cpu0
        jobs_cpu = children_cpu() - kids0
        with open(stats) as f:
            view = json.load(f)["views"][name]
        images = sum(int(o[0]) for o in outs)
        return {
            "jobs": jobs,
            "files": files,
            "images_per_s": images / wall,
            "renders_per_epoch": view["renders"] / args.epochs,
            "shared_hits": view.get("shared_hits", 0),
            "daemon_ms_per_image": 1000 * daemon_cpu / images,
            "jobs_ms_per_image": 1000 * jobs_cpu / images,
            "daemon_cpu_s": daemon_cpu,
        }
    finally:
        subprocess.run([args.prepfs, "umount", mnt], stdout=subprocess.DEVNULL)
        daemon.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prepfs", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--jobs", default="1,3")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--view", default="train=decode,random_resized_crop(224),hflip,uint8")
    args = p.parse_args()
    counts = [int(j) for j in args.jobs.split(",")]
    results = {j: [] for j in counts}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for j in counts:
                results[j].append(run(args, j, work))
                print(json.dumps(results[j][-1]), file=sys.stderr)
    print(f"prepfs {args.prepfs}, {args.epochs} epochs, {args.workers} workers per job, "
          f"view {args.view}, medians of {args.rounds} rounds")
    print("| jobs | files | images/s (all jobs) | renders per epoch | shared hits | "
          "daemon CPU ms/image | daemon CPU s | jobs' CPU ms/image |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for j in counts:
        med = {k: statistics.median(r[k] for r in results[j]) for k in results[j][0]}
        print(f"| {j} | {med['files']:.0f} | {med['images_per_s']:.0f} | "
              f"{med['renders_per_epoch']:.0f} | {med['shared_hits']:.0f} | "
              f"{med['daemon_ms_per_image']:.2f} | {med['daemon_cpu_s']:.1f} | "
              f"{med['jobs_ms_per_image']:.2f} |")


if __name__ == "__main__":
    main()
