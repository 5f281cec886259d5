"""Training step of the TensorFlow 1.x "Deep MNIST for experts" network, written with ``workbench.tf1``.

The tutorial's model code (two 5x5 NHWC convolutions with 32 and 64 filters, 2x2 max
pooling, a 1024-unit layer, dropout, Adam), on 8x8 inputs (the bundled digits' size)
and on the tutorial's own 28x28, batch 50 as in the tutorial, random data. One BLAS
thread. Prints a Markdown table: CPU milliseconds per ``sess.run(train_step)`` (medians
of ``--rounds`` windows) and the transposes left in the step's plan. Public API only,
so ``bench/ab.py`` runs it in an older checkout too::

    .venv/bin/python bench/tf1_cnn.py
    .venv/bin/python bench/ab.py --before /tmp/before --after . --rounds 5 -- bench/tf1_cnn.py
"""

from __future__ import annotations

import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy loads its BLAS
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's workbench

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import workbench.tf1 as tf  # noqa: E402
from workbench.graph.passes import optimize  # noqa: E402


def deep_mnist(side: int):
    """The tutorial's network for ``side`` x ``side`` images; returns its placeholders and train step."""
    tf.reset_default_graph()
    x = tf.placeholder(tf.float32, shape=[None, side * side])
    y_ = tf.placeholder(tf.float32, shape=[None, 10])

    def weight_variable(shape):
        return tf.Variable(tf.truncated_normal(shape, stddev=0.1))

    def bias_variable(shape):
        return tf.Variable(tf.constant(0.1, shape=shape))

    def conv2d(x, W):
        return tf.nn.conv2d(x, W, strides=[1, 1, 1, 1], padding="SAME")

    def max_pool_2x2(x):
        return tf.nn.max_pool(x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")

    x_image = tf.reshape(x, [-1, side, side, 1])
    h_pool1 = max_pool_2x2(tf.nn.relu(conv2d(x_image, weight_variable([5, 5, 1, 32])) + bias_variable([32])))
    h_pool2 = max_pool_2x2(tf.nn.relu(conv2d(h_pool1, weight_variable([5, 5, 32, 64])) + bias_variable([64])))
    flat = (side + 3) // 4 * ((side + 3) // 4) * 64
    h_fc1 = tf.nn.relu(
        tf.matmul(tf.reshape(h_pool2, [-1, flat]), weight_variable([flat, 1024])) + bias_variable([1024])
    )
    keep_prob = tf.placeholder(tf.float32)
    y_conv = tf.matmul(tf.nn.dropout(h_fc1, keep_prob), weight_variable([1024, 10])) + bias_variable([10])
    cross_entropy = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y_, logits=y_conv))
    return x, y_, keep_prob, tf.train.AdamOptimizer(1e-4).minimize(cross_entropy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| input | ms per step | transposes in the step's plan |")
    print("|---|---:|---:|")
    for side in (8, 28):
        x, y_, keep_prob, train_step = deep_mnist(side)
        feed = {
            x: rng.random((args.batch, side * side), dtype=np.float32),
            y_: np.eye(10, dtype=np.float32)[rng.integers(10, size=args.batch)],
            keep_prob: 0.5,
        }
        sess = tf.Session()
        sess.run(tf.global_variables_initializer())
        sess.run(train_step, feed_dict=feed)  # compiles the plan
        windows = []
        for _ in range(args.rounds):
            steps, started = 0, time.process_time()
            while time.process_time() - started < args.seconds:
                sess.run(train_step, feed_dict=feed)
                steps += 1
            windows.append((time.process_time() - started) / steps * 1e3)
        graph = tf.get_default_graph()
        plan = optimize(graph, [train_step.name], [x.op.name, y_.op.name, keep_prob.op.name])
        count = sum(op.type == "transpose" for op in plan.operations)
        print(f"| {side}x{side}x1, batch {args.batch} | {statistics.median(windows):.2f} | {count} |")
        sess.close()


if __name__ == "__main__":
    main()
