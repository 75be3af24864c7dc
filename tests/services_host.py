"""One process per pytest process that serves each test its own reference services.

Starting the services in a process of their own costs most of a CPU second, nearly all of it
imports, and a third of the suite's tests take fresh services (the `services` fixture). So each
pytest process (every xdist worker) starts this host once, and each test asks it for a new set:
three new apps on new ports and a new data directory, seeded as a first start seeds it, with no
state of any earlier set (every service keeps its state in its apps and its data directory,
never in its modules). The services still run apart from the test, in their own process and
event loop, over real HTTP on loopback. Tests that kill or restart the services start their own
process (`services.launcher.start_services`), as before.

Protocol, a line each way on stdin/stdout: ``start DIR`` is answered with the endpoints' JSON
once all three listen (what `services.serve` prints) or ``error: ...``; ``stop DIR`` with
``stopped`` once that set no longer listens. End of stdin (or SIGTERM) stops every set.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from loopwright.processes import ChildProcess, exit_with_parent, spawn
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.serve import serve

REPO = Path(__file__).resolve().parent.parent


class ServicesHost(ChildProcess):
    """The host process, as its pytest process sees it."""

    def __init__(self, log: Path) -> None:
        """Start it; its stderr (a failed set's traceback) goes to `log`."""
        with log.open("ab") as stderr:
            process, lifeline = spawn(
                [sys.executable, "-m", "tests.services_host"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=REPO,
            )
        super().__init__(process, lifeline)
        self.log = log

    @contextmanager
    def serving(self, data_dir: Path) -> Iterator[ServiceEndpoints]:
        """A new set of services on `data_dir` (fresh: seeded) for as long as the block runs."""
        data_dir = data_dir.resolve()
        answer = self._ask(f"start {data_dir}")
        if answer.startswith("error"):
            raise RuntimeError(f"the services host could not start services: {answer}")
        try:
            yield ServiceEndpoints.model_validate_json(answer)
        finally:
            if self._ask(f"stop {data_dir}") != "stopped":
                raise RuntimeError("the services host did not stop the services")

    def _ask(self, line: str) -> str:
        stdin, stdout = self._pipes()
        stdin.write(f"{line}\n".encode())
        stdin.flush()
        answer = stdout.readline().decode().strip()
        if not answer:
            raise RuntimeError(
                f"the services host exited ({self.process.poll()}); its log:\n"
                + self.log.read_text(errors="replace")
            )
        return answer

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def stop(self) -> None:
        """Close its stdin (it stops every set and exits), then stop it as any child."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        super().stop()


async def _host() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
    ended = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ended.set)
    reading = asyncio.create_task(reader.readline())
    ending = asyncio.create_task(ended.wait())
    while True:
        await asyncio.wait([reading, ending], return_when=asyncio.FIRST_COMPLETED)
        if ending.done() or not (line := reading.result().decode().strip()):
            break
        command, _, data_dir = line.partition(" ")
        if command == "start":
            stop = asyncio.Event()
            # Stopped once its test is done: an answer still on its way (a fault's delayed
            # one, that nobody waits for any more) is cut off, not waited for.
            task = asyncio.create_task(serve(Path(data_dir), stop_when=stop, graceful_s=0))
            task.add_done_callback(_report_failure)
            running[data_dir] = (stop, task)  # `serve` prints the endpoints once they listen
        elif command == "stop" and data_dir in running:
            stop, task = running.pop(data_dir)
            stop.set()
            await asyncio.wait([task])
            print("stopped", flush=True)
        else:
            print(f"error: unknown command {line!r}", flush=True)
        reading = asyncio.create_task(reader.readline())
    reading.cancel()
    for stop, _ in running.values():
        stop.set()
    if running:
        await asyncio.wait([task for _, task in running.values()])


def _report_failure(task: asyncio.Task[None]) -> None:
    """A set that failed answers its `start` (or is the next answer read) with the error."""
    if not task.cancelled() and (problem := task.exception()) is not None:
        traceback.print_exception(problem, file=sys.stderr)
        print(f"error: {problem!r}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    exit_with_parent()
    asyncio.run(_host())
