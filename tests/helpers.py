"""Assertions and small computations more than one test file needs.

Fixtures live in ``conftest.py`` and test images in ``imagegen.py``; this module holds the plain
functions, imported as ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Container, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import numpy as np

if TYPE_CHECKING:
    import torch


# Captions for the text towers' parity tests (numpy tower, exact text runtime): short, long
# (truncated at the context length), odd whitespace, case, accents, CJK, digits, contractions,
# literal special tokens, punctuation runs and one character.
TEXTS: tuple[str, ...] = (
    "a banana",
    "A black CAT  sleeping\ton a sofa!!",
    "a photo of " + "very " * 120 + "long text",
    "naïve café — 東京の夜景 🍌",
    "it's 12345 o'clock, they're here",
    "<|startoftext|> inside <|endoftext|> the text",
    "?!?!... ((( ))) ---",
    "x",
)


def assert_one_line_error(
    code: int,
    stderr: str,
    *needles: str,
    codes: Container[int] = (1,),
    prefix: str = "clipsearch: error: ",
) -> None:
    """Assert that a command failed with exactly one line on stderr, naming every needle.

    Args:
        code: the command's exit status.
        stderr: what it wrote to stderr.
        needles: strings the error line must contain.
        codes: the exit statuses allowed (1 is an error; argparse's usage mistakes exit 2).
        prefix: what the line starts with (a usage mistake names the command:
            ``clipsearch search: error: ...``).
    """
    assert code in codes, (code, stderr)
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def model_weights(directory: Path) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint directory's ``model.safetensors``, as numpy arrays."""
    from safetensors.numpy import load_file

    return load_file(str(directory / "model.safetensors"))


def normalised(t: torch.Tensor) -> np.ndarray:
    """The rows of ``t`` scaled to unit L2 norm, as numpy (the reference the encoders must match)."""
    return (t / t.norm(dim=-1, keepdim=True)).numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of two stacks of unit vectors, in float64."""
    return (a.astype(np.float64) * b.astype(np.float64)).sum(axis=1)


def folder_pixels(folder: Path, preprocess: Any) -> torch.Tensor:
    """Every file of ``folder``, in name order, decoded and preprocessed as a build does, stacked."""
    import torch

    from retrieval.images import load_pixels

    return torch.stack([load_pixels(p, preprocess)[0] for p in sorted(folder.iterdir())])


def assert_batch_independent(
    embed: Callable[[torch.Tensor], np.ndarray], pixels: torch.Tensor, together: np.ndarray, spans: Iterable[tuple[int, int]]
) -> None:
    """Each span of ``pixels`` embedded as a batch of its own gives, bit for bit, the rows it
    had in ``together`` (the whole batch's vectors): an update equals a rebuild."""
    for lo, hi in spans:
        np.testing.assert_array_equal(embed(pixels[lo:hi]), together[lo:hi])


@contextlib.contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[str]:
    """A Ray of this process's own on ``num_cpus`` CPUs (yields its GCS address), shut down after.

    ``address="local"``: a plain ``ray.init()`` joins the latest Ray started on the machine, and
    the suite's two workers may each be running one (a second ``ray.init(num_cpus=...)`` then
    fails: "When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
    """
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@contextlib.contextmanager
def moto_s3() -> Iterator[tuple[Any, str]]:
    """moto's S3 (its wire protocol) on a loopback port, with the ``AWS_*`` variables pointing
    at it until the block ends: yields a boto3 client and the endpoint URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": url}
    try:
        with mock.patch.dict(os.environ, env):
            yield boto3.client("s3", endpoint_url=url), url
    finally:
        server.stop()

