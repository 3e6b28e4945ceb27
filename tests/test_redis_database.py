"""A shared example database on Redis: one process finds a failure, another replays it from Redis.

Uses the server named by ``GQA_DECODE_TEST_REDIS_URL`` (``.ci/run`` starts one), else
starts a private ``redis-server`` when one is installed. Without either the test skips
on a developer's machine, but fails in CI (``CI`` set): there it must really run.
"""

import os
import shutil
import socket
import subprocess
import time

import pytest

from gqa_decode_fuzz.runner.profiles import REDIS_KEY_PREFIX
from tests.pytest_runs import clean_environment, run_pytest

PROPERTY = "properties/test_decode.py::test_output_and_lse_within_error_bound"
NATURAL_LOG_LSE = (
    "import math\n"
    "from tests.impls.torch_float32 import run as correct\n"
    "def run(*args):\n"
    "    output, lse = correct(*args)\n"
    "    return output, lse * math.log(2.0)\n"
)


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must test the Redis database (.ci/run installs and starts redis-server)")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    """A Redis database emptied for this test."""
    try:
        import redis
    except ImportError:
        _unavailable("the redis client is not installed: pip install 'hypothesis[redis]'")
    url, server = os.environ.get("GQA_DECODE_TEST_REDIS_URL"), None
    if not url:
        binary = shutil.which("redis-server")
        if binary is None:
            _unavailable("no GQA_DECODE_TEST_REDIS_URL and no redis-server installed")
        port = _free_port()
        server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        _unavailable(f"no Redis server answers at {url}")
    client.flushdb()
    yield url
    client.flushdb()
    if server is not None:
        server.terminate()
        server.wait(timeout=10)


def _run(tmp_path, database: str, profile: str, impl: str, redis_url: str | None):
    env = clean_environment(GQA_DECODE_DATABASE_DIR=str(tmp_path / database), GQA_DECODE_REPORT_DIR="none",
                            GQA_DECODE_FAILURES_DIR=str(tmp_path / "failures"))
    if redis_url:
        env["GQA_DECODE_REDIS_URL"] = redis_url
    return run_pytest(PROPERTY, "-n", "0", "--device=cpu", f"--hypothesis-profile={profile}", f"--impl={impl}",
                      env=env)


def test_a_failure_found_by_one_process_replays_from_redis_in_another(tmp_path, redis_url):
    import redis

    (tmp_path / "natural_lse.py").write_text(NATURAL_LOG_LSE)
    defect = f"{tmp_path / 'natural_lse.py'}:run"

    found = _run(tmp_path, "first", "dev", defect, redis_url)
    assert found.returncode == 1 and "lse not within bound" in found.stdout, found.stdout + found.stderr
    assert redis.Redis.from_url(redis_url).keys(REDIS_KEY_PREFIX + b"*"), "nothing was saved to Redis"

    # A second process with an empty local database, replaying only (no generation): it fails
    # the same way only if the example came from Redis.
    replayed = _run(tmp_path, "second", "repro", defect, redis_url)
    assert replayed.returncode == 1 and "lse not within bound" in replayed.stdout, replayed.stdout + replayed.stderr

    without_redis = _run(tmp_path, "third", "repro", defect, None)
    assert without_redis.returncode == 0, without_redis.stdout + without_redis.stderr
