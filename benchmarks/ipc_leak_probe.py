"""Does a CUDA tensor shared with a child process that dies stay allocated in the parent, and does releasing the
child's IPC reference counters after its death (``isolated_impl._release_shares``, what isolation does) free it?

    python benchmarks/ipc_leak_probe.py [--gib 4]

Prints one table row per case: the parent's reserved memory after the child died and the tensor was dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.multiprocessing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gqa_decode_fuzz.engine.isolated_impl import _dumps, _release_shares  # noqa: E402 - after the path


def _child(connection) -> None:
    shared = connection.recv()  # rebuilt from CUDA IPC: the parent's counter for it now waits on this process
    connection.send(float(shared[0]))
    connection.recv()  # die holding it
    os._exit(1)


def _one(gib: float, release: bool) -> tuple[float, float]:
    context = torch.multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_child, args=(theirs,))
    process.start()
    tensor = torch.ones(int(gib * 2**30) // 2, dtype=torch.bfloat16, device="cuda")
    shares: list = []
    ours.send_bytes(_dumps(tensor, shares))  # pickled as isolation sends a call, its counters recorded
    ours.recv()
    ours.send("die")
    process.join(10)
    del tensor
    if release:
        _release_shares(shares)
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() / 2**30, torch.cuda.mem_get_info()[0] / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0)
    gib = parser.parse_args().gib
    print("| counter released after the death | reserved GiB after | free GiB after |")
    print("|---|---|---|")
    for release in (False, True, False):
        reserved, free = _one(gib, release)
        print(f"| {release} | {reserved:.2f} | {free:.2f} |", flush=True)


if __name__ == "__main__":
    main()
