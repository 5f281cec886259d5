"""The classic TensorFlow 1.x tutorials, run with ``import workbench.tf1 as tf``.

The model code of "MNIST for ML beginners" (softmax regression) and "Deep MNIST for
experts" (the convolutional network) is the tutorials' own, line for line; only the data
loading is replaced: the bundled 8x8 digits (one-hot labels, as ``input_data.read_data_sets(...,
one_hot=True)`` gives), reshaped to ``[-1, 8, 8, 1]`` instead of ``[-1, 28, 28, 1]``, so the
flattened size after two 2x2 poolings is ``2 * 2 * 64`` instead of ``7 * 7 * 64``.
"""

import numpy as np
import pytest

import workbench.tf1 as tf
from workbench.demo import load_digits


class _DataSet:
    """What the tutorials' ``mnist.train`` / ``mnist.test`` offer: images, one-hot labels, next_batch."""

    def __init__(self, images, labels, seed):
        self.images, self.labels = images, np.eye(10, dtype="float32")[labels]
        self._rng, self._order, self._at = np.random.default_rng(seed), np.arange(0), 0

    def next_batch(self, n):
        if self._at + n > len(self._order):
            self._order, self._at = self._rng.permutation(len(self.images)), 0
        picked = self._order[self._at : self._at + n]
        self._at += n
        return self.images[picked], self.labels[picked]


class _Digits:
    def __init__(self):
        d = load_digits(seed=0)
        self.train, self.test = _DataSet(d.x_train, d.y_train, 1), _DataSet(d.x_test, d.y_test, 2)


@pytest.fixture
def mnist():
    tf.reset_default_graph()
    yield _Digits()
    session = tf.get_default_session()
    if session is not None:
        session.close()
    tf.reset_default_graph()


@pytest.mark.slow
def test_mnist_for_ml_beginners_softmax_regression(mnist):
    x = tf.placeholder(tf.float32, [None, 64])
    W = tf.Variable(tf.zeros([64, 10]))
    b = tf.Variable(tf.zeros([10]))
    y = tf.nn.softmax(tf.matmul(x, W) + b)
    y_ = tf.placeholder(tf.float32, [None, 10])
    cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf.log(y), reduction_indices=[1]))
    train_step = tf.train.GradientDescentOptimizer(0.5).minimize(cross_entropy)

    sess = tf.InteractiveSession()
    tf.global_variables_initializer().run()
    for _ in range(1000):
        batch_xs, batch_ys = mnist.train.next_batch(100)
        sess.run(train_step, feed_dict={x: batch_xs, y_: batch_ys})

    correct_prediction = tf.equal(tf.argmax(y, 1), tf.argmax(y_, 1))
    accuracy = tf.reduce_mean(tf.cast(correct_prediction, tf.float32))
    result = sess.run(accuracy, feed_dict={x: mnist.test.images, y_: mnist.test.labels})
    assert result >= 0.93  # the tutorial's "about 92%" on MNIST; softmax regression reaches ~0.95 on the digits


@pytest.mark.slow  # 200 steps of a 3.3M-multiply-add network: about 20 s on a quiet machine
def test_deep_mnist_for_experts_convolutional_network(mnist):
    sess = tf.InteractiveSession()
    x = tf.placeholder(tf.float32, shape=[None, 64])
    y_ = tf.placeholder(tf.float32, shape=[None, 10])

    def weight_variable(shape):
        initial = tf.truncated_normal(shape, stddev=0.1)
        return tf.Variable(initial)

    def bias_variable(shape):
        initial = tf.constant(0.1, shape=shape)
        return tf.Variable(initial)

    def conv2d(x, W):
        return tf.nn.conv2d(x, W, strides=[1, 1, 1, 1], padding="SAME")

    def max_pool_2x2(x):
        return tf.nn.max_pool(x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")

    W_conv1 = weight_variable([5, 5, 1, 32])
    b_conv1 = bias_variable([32])
    x_image = tf.reshape(x, [-1, 8, 8, 1])
    h_conv1 = tf.nn.relu(conv2d(x_image, W_conv1) + b_conv1)
    h_pool1 = max_pool_2x2(h_conv1)

    W_conv2 = weight_variable([5, 5, 32, 64])
    b_conv2 = bias_variable([64])
    h_conv2 = tf.nn.relu(conv2d(h_pool1, W_conv2) + b_conv2)
    h_pool2 = max_pool_2x2(h_conv2)

    W_fc1 = weight_variable([2 * 2 * 64, 1024])
    b_fc1 = bias_variable([1024])
    h_pool2_flat = tf.reshape(h_pool2, [-1, 2 * 2 * 64])
    h_fc1 = tf.nn.relu(tf.matmul(h_pool2_flat, W_fc1) + b_fc1)

    keep_prob = tf.placeholder(tf.float32)
    h_fc1_drop = tf.nn.dropout(h_fc1, keep_prob)

    W_fc2 = weight_variable([1024, 10])
    b_fc2 = bias_variable([10])
    y_conv = tf.matmul(h_fc1_drop, W_fc2) + b_fc2

    cross_entropy = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y_, logits=y_conv))
    train_step = tf.train.AdamOptimizer(1e-4).minimize(cross_entropy)
    correct_prediction = tf.equal(tf.argmax(y_conv, 1), tf.argmax(y_, 1))
    accuracy = tf.reduce_mean(tf.cast(correct_prediction, tf.float32))
    sess.run(tf.global_variables_initializer())
    train_accuracies = []
    for i in range(200):  # the tutorial's 20000 steps of MNIST; 200 reach ~0.92 on the digits
        batch = mnist.train.next_batch(50)
        if i % 100 == 0:
            train_accuracy = accuracy.eval(feed_dict={x: batch[0], y_: batch[1], keep_prob: 1.0})
            train_accuracies.append(train_accuracy)
        train_step.run(feed_dict={x: batch[0], y_: batch[1], keep_prob: 0.5})

    test_accuracy = accuracy.eval(feed_dict={x: mnist.test.images, y_: mnist.test.labels, keep_prob: 1.0})
    assert train_accuracies[0] < 0.5 < train_accuracies[-1]  # it learned, from chance
    assert test_accuracy >= 0.9
    # the graph holds the model, not the random constants that initialized it
    assert not any(
        op.type == "constant" and op.outputs[0].shape == (5, 5, 32, 64) for op in tf.get_default_graph().operations
    )
