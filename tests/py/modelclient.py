"""What the random-I/O clients of the integration scripts share.

Each script writes its client in Python with libnbd's bindings and checks
what it reads against a model of the export (a byte array).  A run is
reproducible: the seed is printed, and SEED= replays it.
"""
import os
import random


def seeded_rng(salt=0):
    """(seed, random.Random(seed + salt)), the seed $SEED or a fresh one;
    prints it (a failure message should name it too).  Clients of one run
    that must not repeat each other pass each its own salt."""
    seed = int(os.environ.get("SEED") or random.randrange(1 << 30))
    print("seed", seed, "(set SEED= to replay)")
    return seed, random.Random(seed + salt)


def load_model(path=None):
    """The model of the export: the file $MODEL (or path) as a bytearray."""
    with open(path or os.environ["MODEL"], "rb") as f:
        return bytearray(f.read())
