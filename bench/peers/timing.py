"""timing.py - what every peer measurement shares: the thread count, medians after warm-up,
and the relative L2 error that decides whether a peer computes the same thing as iha."""

import statistics
import time

import numpy as np

# The machine's two cores, for every peer and for iha (PoCL uses every core it sees).
THREADS = 2
# A float32 result against a float64 reference: doc/spec.md's contract for iha is 1e-5; peers
# may sum in another order (and OpenVINO may fuse differently), so they get ten times that.
TOLERANCE = 1e-4


def median_seconds(fn, reps, warmup=1):
    """Median wall seconds of fn() over reps calls after warmup calls (threads start, pages fault
    in, lazy compilers compile)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rel_l2(out, ref):
    """||out - ref|| / ||ref|| in float64; inf when out holds a non-finite value."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


class Mismatch(Exception):
    """A peer whose output differs from the reference: it is reported, never timed."""


def check(what, out, ref, tolerance=TOLERANCE):
    """Raises Mismatch unless out matches ref within tolerance; returns the error."""
    err = rel_l2(out, ref)
    if not err <= tolerance:
        raise Mismatch(f"{what}: relative L2 error {err:.3g} against the reference (at most {tolerance:g})")
    return err
