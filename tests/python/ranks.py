"""Running a test body on several gloo ranks (loopback): spawn, wait with a deadline, read each rank's report.

Each worker is called as ``worker(rank, port, out_dir)`` and writes ``out_dir/rank<N>.json``
(a dict; an ``"error"`` key carries a rank's traceback): :func:`rank_report` does that part.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: Callable, out_dir: Path, world: int, timeout_s: float) -> list[dict]:
    """Every rank's report; fails the test when the ranks outlive ``timeout_s`` or a rank reports an error."""
    context = mp.start_processes(worker, args=(free_port(), str(out_dir)), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} ranks did not finish within {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    reports = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world)]
    for report in reports:
        assert "error" not in report, f"rank {report['rank']} failed:\n{report['error']}"
    return reports


@contextlib.contextmanager
def rank_report(rank: int, port: int, out_dir: str, world: int, timeout_s: float, **fields: Any) -> Iterator[dict]:
    """A worker's side: joins the gloo group on loopback and yields its report (``{"rank": rank, **fields}``);
    after the body, a barrier. Whatever happens, the report is written (an exception's traceback under
    ``"error"``, for the parent to fail the test with) and the group is left."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    report: dict = {"rank": rank, **fields}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        yield report
        dist.barrier()
    except BaseException:  # reported to the parent, which fails the test
        report["error"] = traceback.format_exc()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
        if dist.is_initialized():
            dist.destroy_process_group()
