"""What every example shares: command-line arguments, and the one line each example ends with.

Each example reads a prepfs mount with an unmodified loader and ends by printing one JSON line:
the example's name, the items it read, items per second, and the mount's cache hit rate (from
MNT/.prepfs/stats.json, which any reader of the mount can open).
"""
import argparse
import json
import os
import time


def arguments(description):
    """--mount MNT (required), --source SRC (where an example writes data it makes itself)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--mount", required=True, help="the prepfs mountpoint")
    parser.add_argument("--source", help="the mounted dataset directory, for data the example makes")
    parser.add_argument("--epochs", type=int, default=2)
    return parser.parse_args()


def hit_rate(mount):
    """The mount's RAM cache hit rate since it was mounted."""
    with open(os.path.join(mount, ".prepfs", "stats.json")) as f:
        return json.load(f)["cache"]["hit_rate"]


class Timer:
    """Counts items and seconds, then prints the example's result line."""

    def __init__(self, example):
        self.example, self.items, self.started = example, 0, time.perf_counter()

    def add(self, n):
        self.items += int(n)

    def report(self, mount):
        seconds = time.perf_counter() - self.started
        print(json.dumps({
            "example": self.example,
            "items": self.items,
            "items_per_s": round(self.items / seconds, 1),
            "hit_rate": hit_rate(mount),
        }))
