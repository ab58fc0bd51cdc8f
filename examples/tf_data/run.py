"""tf.data over a prepfs mount: the raw JPEGs decoded by TensorFlow, and a tensor view's .npy files.

The mount was started with --view train=decode,random_resized_crop(64),hflip,normalize(imagenet);
its files are float32 CHW arrays, loaded with numpy inside the pipeline.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _prepfs import Timer, arguments  # noqa: E402

args = arguments(__doc__)


def raw(path):
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    image = tf.image.resize(image, (64, 64)) / 255.0
    return tf.image.random_flip_left_right(image)


def view(path):
    array = tf.numpy_function(lambda p: np.load(p.decode()), [path], tf.float32)
    return tf.ensure_shape(array, (3, 64, 64))


pipelines = {
    "raw": (os.path.join(args.mount, "images", "*", "*.jpg"), raw, (64, 64, 3)),
    "view": (os.path.join(args.mount, ".prepfs", "views", "train", "images", "*", "*.npy"), view,
             (3, 64, 64)),
}
timer = Timer("tf_data")
for name, (pattern, load, shape) in pipelines.items():
    files = tf.io.gfile.glob(pattern)
    assert files, f"{name}: nothing matches {pattern}"
    dataset = (
        tf.data.Dataset.from_tensor_slices(files)
        .shuffle(len(files))
        .map(load, num_parallel_calls=2)
        .batch(16)
        .prefetch(2)
    )
    for epoch in range(args.epochs):
        seen = 0
        for batch in dataset:
            assert tuple(batch.shape[1:]) == shape, (name, batch.shape)
            seen += int(batch.shape[0])
        assert seen == len(files), (name, seen, len(files))
        timer.add(seen)
timer.report(args.mount)
