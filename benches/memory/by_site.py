"""Bytes per file at a heaptrack peak, grouped by call site: folded stacks (`heaptrack_print
--flamegraph-cost-type peak -F`) grouped by their last four frames outside the standard
library, most bytes first. Usage: by_site.py PEAK.folded FILES [ROWS]"""
import collections
import re
import sys

# Frames of the standard library and the allocator, skipped to reach the caller that asked.
STD = {"alloc.rs", "boxed.rs", "sync.rs", "raw_vec.rs", "spec_from_elem.rs", "function.rs",
       "unwind_safe.rs", "panicking.rs", "panic.rs", "backtrace.rs", "lifecycle.rs", "unix.rs",
       "pthread_create.c", "clone3.S", "table.rs", "map.rs", "vec.rs", "string.rs", "path.rs"}

def main():
    folded, files = sys.argv[1], int(sys.argv[2])
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    sites = collections.Counter()
    for line in open(folded):
        stack, _, cost = line.rstrip().rpartition(" ")
        frames = []
        for f in stack.split(";"):
            m = re.match(r"(.*) \((.*)\)$", f)
            name, where = (m.group(1), m.group(2)) if m else (f, "")
            if where in STD or name.startswith(("_RNv", "0x")):
                continue
            frames.append(f"{re.sub(r'<.*?>', '', name)}@{where}")
        sites[" > ".join(frames[-4:])] += int(cost)
    total = sum(sites.values())
    print(f"peak: {total / 1e6:.2f} MB, {total / files:.0f} B per file")
    for site, cost in sites.most_common(rows):
        print(f"{cost / files:8.1f} B/file {cost / 1e6:8.2f} MB  {site}")

main()
