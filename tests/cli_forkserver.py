"""Each `loopwright ...` a test runs in a new process (`runtime_fixtures.cli`, or `start_cli`
for one that runs on while the test goes on), without paying for the imports each time.

A new interpreter spends about a CPU second importing LangGraph, LangChain and the reference
agent before the command does anything, and the suite runs the command line a few hundred
times. So each pytest process (every xdist worker) starts this server once; it imports what
every command imports and waits. For each command it forks: the child is a new process of its
own, as `python -m loopwright` would be (its own pid, arguments, environment, working
directory, standard streams; it exits, crashes or is killed on its own), that starts with those
modules already imported. The server holds no thread, no connection and no open file of the
runtime's when it forks: nothing a command could share with another.

Protocol, over a Unix socket of packets: the client sends the command as JSON (argv,
environment, working directory) with its stdin, stdout and stderr as file descriptors; the
server answers the child's pid, then its exit code (negative: killed by that signal).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from loopwright.graph.build import compile_graph
from loopwright.processes import LIFELINE_ENV, ChildProcess, spawn

REPO = Path(__file__).resolve().parent.parent
PACKET = 1 << 20
# What the commands import (the default agent's included), imported once by the server.
PRELOADED = (
    "loopwright.cli",
    "loopwright.cli.hosting",
    "loopwright.cli.ending",
    "loopwright.reports",
    "loopwright.run_list",
    "loopwright.runner",
    "loopwright.timeline",
    "loopwright._loading",
    "loopwright_refunds.agent",
    "typer._adapters",
)


class Finished(subprocess.CompletedProcess[str]):
    """A command's process that ended: what `subprocess.run` answers, and its pid (a test may
    give up the lease of a process it saw crash, `LeaseStore.release_for_dead`)."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str, pid: int):
        super().__init__(args, returncode, stdout, stderr)
        self.pid = pid


class Started:
    """A command's process that runs on, as the `subprocess.Popen` of `python -m loopwright`
    shows one: `pid`, `args`, `stdout` / `stderr` (text, where PIPE), `returncode`, `poll`,
    `wait`, `communicate`, `send_signal`, `terminate`, `kill`. Its exit code comes from the
    server, which is its parent."""

    def __init__(
        self,
        args: list[str],
        conn: socket.socket,
        pid: int,
        stdout: IO[str] | None,
        stderr: IO[str] | None,
    ) -> None:
        self.args, self.pid, self.stdout, self.stderr = args, pid, stdout, stderr
        self.returncode: int | None = None
        self._conn = conn

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.settimeout(0)  # a look, not a wait
            with contextlib.suppress(BlockingIOError):  # still running
                self._ended(self._conn.recv(64))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                self._ended(self._conn.recv(64))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:  # as Popen's
        """Read the pipes to their end (each on a thread: neither may fill and stall the
        process), then wait for the process."""
        read: dict[int, str] = {}
        readers = [
            threading.Thread(target=lambda i=i, pipe=pipe: read.__setitem__(i, pipe.read()))
            for i, pipe in enumerate((self.stdout, self.stderr))
            if pipe is not None
        ]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        return read.get(0), read.get(1)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _ended(self, answer: bytes) -> None:
        if not answer:
            raise RuntimeError("the CLI server closed the connection without an exit code")
        self.returncode = int(answer)
        self._conn.close()


class CliServer(ChildProcess):
    """The server process, as its pytest process sees it."""

    def __init__(self) -> None:
        # In Linux's abstract namespace (the leading NUL): no file, so nothing is left behind
        # by a server that is killed.
        name = f"loopwright-cli-{uuid.uuid4().hex}"
        self.address = f"\0{name}"
        process, lifeline = spawn(
            [sys.executable, "-m", "tests.cli_forkserver", name],
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )
        super().__init__(process, lifeline)

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Finished:
        """Run `loopwright ARGV` in a process forked from the server, as `subprocess.run` with
        `stdin=DEVNULL, capture_output=True, text=True, timeout=timeout` runs `python -m
        loopwright ARGV` (its output in temp files: nothing to drain while it runs)."""
        deadline = time.monotonic() + timeout
        with (
            open(os.devnull, "rb") as stdin,
            tempfile.TemporaryFile() as stdout,
            tempfile.TemporaryFile() as stderr,
        ):
            conn, pid = self._request(argv, env, cwd, (stdin, stdout, stderr), deadline)
            with conn:
                try:
                    code = int(self._answer(conn, deadline))
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(argv, timeout) from None
            argv = [sys.executable, "-m", "loopwright", *argv]
            return Finished(argv, code, _text(stdout), _text(stderr), pid)

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        stdout: int,
        stderr: int,
        timeout: float,
    ) -> Started:
        """Start `loopwright ARGV` in a process forked from the server and return at once, as
        `subprocess.Popen(..., stdin=DEVNULL, stdout=stdout, stderr=stderr, text=True)` starts
        `python -m loopwright ARGV`: for a command that runs until the test stops it (a
        worker), is signalled, or is read while it runs. `stdout` and `stderr` are DEVNULL or
        PIPE, `stderr` may be STDOUT; `timeout` bounds the wait for its pid."""
        pipes: list[IO[str] | None] = []  # this process's ends of the child's pipes
        try:
            with contextlib.ExitStack() as given:  # the ends the child gets, closed here
                ends: list[IO[bytes]] = [given.enter_context(open(os.devnull, "rb"))]
                for how in (stdout, stderr):
                    if how == subprocess.STDOUT and len(ends) == 2:
                        ends.append(ends[1])
                        pipes.append(None)
                    elif how == subprocess.PIPE:
                        read, write = os.pipe()
                        ends.append(given.enter_context(open(write, "wb")))
                        pipes.append(open(read, encoding=locale.getpreferredencoding(False)))  # noqa: SIM115
                    elif how == subprocess.DEVNULL:
                        ends.append(given.enter_context(open(os.devnull, "wb")))
                        pipes.append(None)
                    else:
                        raise ValueError(f"DEVNULL, PIPE or (for stderr) STDOUT, not {how}")
                deadline = time.monotonic() + timeout
                conn, pid = self._request(argv, env, cwd, tuple(ends), deadline)
        except BaseException:
            for pipe in pipes:
                if pipe is not None:
                    pipe.close()
            raise
        return Started([sys.executable, "-m", "loopwright", *argv], conn, pid, *pipes)

    def _request(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        streams: tuple[IO[Any], ...],
        deadline: float,
    ) -> tuple[socket.socket, int]:
        """Ask for the command's process, with `streams` as its stdin, stdout and stderr: the
        connection its exit code will come on, and its pid."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._connect(conn, deadline)
            request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
            socket.send_fds(conn, [request], [stream.fileno() for stream in streams])
            return conn, int(self._answer(conn, deadline))
        except BaseException:
            conn.close()
            raise

    def _connect(self, conn: socket.socket, deadline: float) -> None:
        """Connect, once the server listens (it may still be importing)."""
        while True:
            try:
                conn.connect(self.address)
                return
            except ConnectionRefusedError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the CLI server exited {self.process.returncode}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @staticmethod
    def _answer(conn: socket.socket, deadline: float) -> str:
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        answer = conn.recv(64).decode()
        if not answer:
            raise RuntimeError("the CLI server closed the connection without an answer")
        return answer


_shared: CliServer | None = None


def shared() -> CliServer:
    """This pytest process's server, started the first time a test runs the command line."""
    global _shared
    if _shared is None or _shared.process.poll() is not None:
        _shared = CliServer()
    return _shared


def stop_shared() -> None:
    global _shared
    if _shared is not None:
        _shared.stop()
        _shared = None


def _text(output: IO[bytes]) -> str:
    """What `subprocess.run(..., text=True)` makes of a stream's bytes."""
    output.seek(0)
    text = output.read().decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _serve(name: str) -> dict[str, Any] | None:
    """Accept commands until the lifeline ends; in a forked child, return its command."""
    for module in PRELOADED:
        importlib.import_module(module)
    compile_graph()  # compiled once per process (graph.build): here, for every command
    gc.freeze()  # the children's collector leaves these objects (and their pages) alone

    lifeline = int(os.environ.pop(LIFELINE_ENV))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"\0{name}")
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(lifeline, selectors.EVENT_READ, "lifeline")
    while True:
        for key, _ in selector.select():
            if key.data == "lifeline":
                return None  # the pytest process is gone
            if key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, PACKET, 3)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # the command's process: none of the server's files
                    for held in list(selector.get_map().values()):
                        if isinstance(held.data, tuple):  # another command's pidfd, connection
                            os.close(held.fd)
                            held.data[1].close()
                    selector.close()
                    listener.close()
                    os.close(lifeline)
                    conn.close()
                    return {**json.loads(message), "fds": fds}
                for fd in fds:
                    os.close(fd)
                conn.sendall(str(pid).encode())
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:  # a command's process ended
                pid, conn = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the client gave up (a timeout)
                    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                conn.close()


def _become(command: dict[str, Any]) -> None:
    """Run `python -m loopwright ARGV` with the command's streams, directory and environment
    (and so its import path: the working directory first, then PYTHONPATH)."""
    for target, fd in enumerate(command["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [command["cwd"], *extra]
    sys.argv = ["loopwright", *command["argv"]]  # runpy puts the module's path first
    runpy.run_module("loopwright", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if (command := _serve(sys.argv[1])) is not None:
        _become(command)
