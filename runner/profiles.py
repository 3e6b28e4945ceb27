"""Hypothesis profiles, example databases and case sizes, registered in one place.

Every profile names its parent explicitly: Hypothesis auto-loads its built-in
``ci`` profile when ``CI`` is set, and a profile registered without ``parent=``
would inherit from whichever profile happens to be active.

Example databases (environment variables):

- ``GQA_DECODE_DATABASE_DIR``: the local directory database (default ``.hypothesis/examples``).
- ``GQA_DECODE_REDIS_URL`` (``redis://host:port/db``): a database shared by several runner
  hosts; examples are saved to and replayed from it as well as the local directory.
- ``GQA_DECODE_NIGHTLY_REPO`` (``owner/repo``): the ``dev`` profile also replays, read-only,
  the database that the nightly GPU workflow uploads as the artifact ``NIGHTLY_ARTIFACT``
  (set ``GITHUB_TOKEN`` for a private repository), so a first local run replays nightly's
  failures.

Every profile also skips Hypothesis's Pareto front (``skip_pareto_front``) unless
``GQA_DECODE_PARETO_FRONT=keep``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    GitHubArtifactDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)
from hypothesis.internal.conjecture import pareto

from gqa_decode_fuzz.generation.sizes import SizeLimits

DATABASE_DIR = Path(".hypothesis") / "examples"  # relative to the working directory, as Hypothesis's own
DATABASE_DIR_ENV = "GQA_DECODE_DATABASE_DIR"
REDIS_URL_ENV = "GQA_DECODE_REDIS_URL"
NIGHTLY_REPO_ENV = "GQA_DECODE_NIGHTLY_REPO"
NIGHTLY_ARTIFACT = "hypothesis-example-db"  # the name .github/workflows/nightly.yml uploads
REDIS_KEY_PREFIX = b"gqa-decode:"
PARETO_FRONT_ENV = "GQA_DECODE_PARETO_FRONT"  # "keep": Hypothesis tracks its Pareto front (skip_pareto_front)

# Sizes follow the device, not the profile, so that a database entry found by one
# profile replays under another on the same kind of machine.
CASE_SIZES = {
    "small": SizeLimits(max_batch=4, max_len=300, max_spare_pages=512),
    "large": SizeLimits(max_batch=16, max_len=2048, max_spare_pages=8192, max_q_len=512, max_kv_len=2048,
                        max_prefill_batch=8),
}

PROFILE_DOCS = {
    "dev": "local default: 40 examples, local example database (+ nightly's, read-only, when named)",
    "ci": "CPU interpreter in CI: 40 examples, derandomized, no database",
    "gpu": "GPU box: 300 examples, local example database",
    "nightly": "nightly GPU job: 5000 examples, target-guided, local example database",
    "repro": "replays the example database only (explicit and reuse phases)",
}


def local_database() -> ExampleDatabase:
    """The writable database: the local directory, plus Redis when ``GQA_DECODE_REDIS_URL`` is set."""
    directory = DirectoryBasedExampleDatabase(os.environ.get(DATABASE_DIR_ENV) or str(DATABASE_DIR))
    url = os.environ.get(REDIS_URL_ENV)
    return MultiplexedDatabase(directory, redis_database(url)) if url else directory


def redis_database(url: str) -> ExampleDatabase:
    """A Redis example database (``hypothesis[redis]``); connects lazily, on first use."""
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as error:
        raise ImportError(f"{REDIS_URL_ENV}={url!r} needs the redis client: pip install 'hypothesis[redis]'") from error
    return RedisExampleDatabase(redis.Redis.from_url(url), key_prefix=REDIS_KEY_PREFIX)


def nightly_database(repository: str) -> ExampleDatabase:
    """Nightly's uploaded database, read-only: ``repository`` is ``owner/repo``."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
        raise ValueError(f"{NIGHTLY_REPO_ENV}={repository!r}: expected 'owner/repo'")
    owner, repo = repository.split("/")
    return ReadOnlyDatabase(GitHubArtifactDatabase(owner, repo, artifact_name=NIGHTLY_ARTIFACT))


def dev_database() -> ExampleDatabase:
    """The local database, multiplexed with nightly's read-only one when ``GQA_DECODE_NIGHTLY_REPO`` is set."""
    repository = os.environ.get(NIGHTLY_REPO_ENV)
    local = local_database()
    return MultiplexedDatabase(local, nightly_database(repository)) if repository else local


def register_profiles() -> None:
    """Register dev, ci, gpu, nightly and repro, each with the pristine default as parent."""
    base = settings.get_profile("default")
    database = local_database()
    # No explain phase: to point at the lines only failing examples ran, Hypothesis traces every line of every
    # shrink step (sys.settrace before Python 3.12), and here those lines are the suite's own, never the kernel's.
    # That tracing made failing runs several times slower (docs/performance.md, "Shrinking").
    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow],
                  phases=tuple(phase for phase in Phase if phase is not Phase.explain))
    settings.register_profile("dev", parent=base, max_examples=40, database=dev_database(), **common)
    settings.register_profile("ci", parent=base, max_examples=40, derandomize=True, database=None, **common)
    settings.register_profile("gpu", parent=base, max_examples=300, database=database, **common)
    settings.register_profile("nightly", parent=base, max_examples=5000, database=database, **common)
    settings.register_profile(
        "repro", parent=base, database=database, **{**common, "phases": (Phase.explicit, Phase.reuse)}
    )


def _never_on_the_front(self: object, data: object) -> bool:
    return False


def skip_pareto_front() -> None:
    """Keep Hypothesis from tracking the Pareto front of targeted examples (every profile with a database).

    Hypothesis offers each example that called ``target()`` (every property, through
    ``properties.checks.steer_toward_the_bound``) to a front of non-dominated examples, comparing choice
    sequences in pure Python: a front its own source calls only marginally useful, costly in long items
    (docs/performance.md). Targeting itself climbs from the best example of each label, which Hypothesis keeps
    apart; with the front empty its optimiser has nothing to do and front entries of older runs' databases are
    dropped. Left alone where this Hypothesis's ``pareto`` module has no ``ParetoFront.add``, or where
    ``GQA_DECODE_PARETO_FRONT=keep``.
    """
    if os.environ.get(PARETO_FRONT_ENV) == "keep":
        return
    front = getattr(pareto, "ParetoFront", None)
    if front is not None and callable(getattr(front, "add", None)):
        front.add = _never_on_the_front


def default_profile() -> str:
    """``ci`` when the CI variable is set (as CI services do), else ``dev``."""
    return "ci" if os.environ.get("CI") else "dev"
