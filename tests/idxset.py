"""Made-up IDX data sets for chorus-train's tests: 28x28 images in the four
files of an MNIST folder, with pixel statistics far from Fashion-MNIST's
(mean 0.2860, std 0.3530).

    python3 idxset.py DIR [TRAIN [TEST]]

writes DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz and prints the
mean and standard deviation of the training pixels (scaled to [0, 1]),
each to four significant digits."""
import gzip
import os
import struct
import sys

ROWS = COLS = 28


def label(i):
    return i % 10


def pixel(i, k):
    """Bright images (150 to 250): vertical stripes whose phase tells the
    class, and some noise."""
    stripe = ((k % COLS) + 3 * label(i)) % 30 < 15
    return 150 + (70 if stripe else 0) + (i * 7 + k * 13) % 31


def images(n):
    head = struct.pack(">IIII", 0x803, n, ROWS, COLS)
    return head + bytes(pixel(i, k) for i in range(n) for k in range(ROWS * COLS))


def labels(n):
    return struct.pack(">II", 0x801, n) + bytes(label(i) for i in range(n))


def stats(n):
    """Mean and population standard deviation of the n training images'
    pixels over 255, rounded to four significant digits."""
    count = n * ROWS * COLS
    values = [pixel(i, k) / 255 for i in range(n) for k in range(ROWS * COLS)]
    mean = sum(values) / count
    std = (sum((v - mean) ** 2 for v in values) / count) ** 0.5
    return float("%.4g" % mean), float("%.4g" % std)


def write(folder, train=600, test=100):
    os.makedirs(folder, exist_ok=True)
    for name, data in (("train-images-idx3-ubyte", images(train)),
                       ("train-labels-idx1-ubyte", labels(train)),
                       ("t10k-images-idx3-ubyte", images(test)),
                       ("t10k-labels-idx1-ubyte", labels(test))):
        with gzip.open(os.path.join(folder, name + ".gz"), "wb") as f:
            f.write(data)
    return stats(train)


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[2:4]]
    print("%.4g %.4g" % write(sys.argv[1], *sizes))
