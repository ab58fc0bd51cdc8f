"""tf.data over prepfs views, as a TensorFlow user would write it, two ways.

Usage: tf_view.py RANDOM_ROOT FIXED_ROOT N_IMAGES SIZE FIXED_SIZE (float32 CHW views, one
directory level of classes). (a) Dataset.list_files(shuffle=True) + tf.numpy_function(np.load),
batched, one full epoch of RANDOM_ROOT; (b) tf.io.read_file + tf.io.decode_raw of the bytes after
the fixed 128-byte .npy header. On the random view (a fresh augmentation per open) both agree in
shape, dtype and finiteness; on the deterministic FIXED_ROOT they give identical arrays for every
file. Any failure, an import failure included, exits non-zero; prints one JSON line.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

HEADER = 128  # prepfs writes .npy v1.0 with the header padded to 128 bytes (checked below)
random_root, fixed_root = sys.argv[1], sys.argv[2]
n_images, size, fixed_size = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])


def by_np_load(files, size):
    def load(path):
        x = tf.numpy_function(lambda p: np.load(p.decode()), [path], tf.float32)
        x.set_shape((3, size, size))
        return x
    return files.map(load, num_parallel_calls=2)


def by_decode_raw(files, size):
    def load(path):
        data = tf.io.read_file(path)
        body = tf.strings.substr(data, HEADER, tf.strings.length(data) - HEADER)
        return tf.reshape(tf.io.decode_raw(body, tf.float32), (3, size, size))
    return files.map(load, num_parallel_calls=2)


# (a) one shuffled epoch, batched.
seen = 0
files = tf.data.Dataset.list_files(f"{random_root}/*/*.npy", shuffle=True)
for batch in by_np_load(files, size).batch(4):
    assert batch.dtype == tf.float32 and tuple(batch.shape[1:]) == (3, size, size), batch.shape
    assert bool(tf.reduce_all(tf.math.is_finite(batch)))
    seen += int(batch.shape[0])
assert seen == n_images, f"one epoch gave {seen} images"

# (b) one file of the random view both ways, then every file of the fixed view both ways.
one = tf.data.Dataset.from_tensor_slices(sorted(tf.io.gfile.glob(f"{random_root}/*/*.npy"))[:1])
for a, b in zip(by_np_load(one, size), by_decode_raw(one, size)):
    assert a.dtype == b.dtype == tf.float32 and a.shape == b.shape == (3, size, size)
    assert bool(tf.reduce_all(tf.math.is_finite(a))) and bool(tf.reduce_all(tf.math.is_finite(b)))
paths = sorted(tf.io.gfile.glob(f"{fixed_root}/*/*.npy"))
assert len(paths) == n_images, paths
with open(paths[0], "rb") as f:
    np.lib.format.read_magic(f)
    np.lib.format.read_array_header_1_0(f)
    assert f.tell() == HEADER, f"header is {f.tell()} bytes"
fixed = tf.data.Dataset.from_tensor_slices(paths)
identical = 0
for a, b in zip(by_np_load(fixed, fixed_size), by_decode_raw(fixed, fixed_size)):
    assert np.array_equal(a.numpy(), b.numpy()), "np.load and decode_raw differ"
    identical += 1
print(json.dumps({"images": seen, "identical": identical, "shape": [3, size, size]}))
