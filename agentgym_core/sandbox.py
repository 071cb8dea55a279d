"""Run model-written Python in a real sandbox: no network, no files but a scratch folder, limits.

Running code a model wrote is the most dangerous thing an env can do, so the
isolation is the kernel's, not Python's: each call is a fresh interpreter
under bubblewrap (`bwrap`), in new user, PID, network, mount, IPC and UTS
namespaces, with:

- **files**: the system's `/usr` (and the interpreter's own prefix) read-only,
  a private `/tmp`, and a scratch folder `/scratch` (a tmpfs of
  `scratch_mib`, empty at each call): the repository, home folders, other
  processes' `/proc` and every other host path are not there;
- **network**: none (a network namespace of its own, with no interface up);
- **user**: launched as an unprivileged uid (`nobody` when we are root), with
  no capabilities and no further user namespaces;
- **limits** (`SandboxLimits`, through `prlimit`): address space, CPU seconds,
  processes (a fork bomb stops at `max_processes`), file size, open files;
  memory of the whole sandbox in a cgroup of its own where the machine lets
  us make one (`sandbox_cgroup`), else a lower process count; a
  wall-clock timeout kills the whole sandbox; stdout and stderr are cut at
  `output_chars` each, as they are read (the rest is read and dropped, never
  held in this process);
- **environment**: cleared (no secret of the host's environment goes in);
  Python runs isolated (`-I`: no user site, no PYTHON* variables), with the
  standard library only.

`bwrap` comes from Debian's `bubblewrap` (`make` installs it when missing,
`scripts/ensure_bubblewrap.sh`); without it `PythonSandbox` refuses to run
and says how to install it. Limits and their reasons: `docs/sandbox.md`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from agentgym_core import sandbox_cgroup
from agentgym_core.sandbox_cgroup import MemoryCgroup

NOBODY = 65534
"""The uid and gid a sandbox runs as when we are root (Debian's `nobody`/`nogroup`)."""


class SandboxUnavailable(RuntimeError):
    """bubblewrap (or prlimit) is missing, or this kernel refuses its namespaces."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. The defaults fit an agent's arithmetic and small scripts."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole sandbox is killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU): a busy loop is stopped here."""
    memory_mib: int = 512
    """Memory of the whole sandbox (a cgroup of its own, where the machine allows one), and
    the address space (RLIMIT_AS) of each of its processes."""
    max_processes: int = 32
    """Processes and threads of the sandbox's user (RLIMIT_NPROC): a fork bomb stops here."""
    max_processes_without_cgroup: int = 4
    """The process limit where no cgroup can be made: then only RLIMIT_AS bounds memory, per
    process, so a sandbox may hold this many times `memory_mib`."""
    file_mib: int = 16
    """Largest file it may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    scratch_mib: int = 32
    """Size of the `/scratch` tmpfs (and of `/tmp`)."""
    output_chars: int = 8192
    """Characters of stdout, and of stderr, kept; the rest is cut with a note."""


@dataclass(frozen=True)
class SandboxResult:
    """What a call printed and how it ended."""

    stdout: str
    stderr: str
    exit_code: int
    """The interpreter's exit status; negative: killed by that signal."""
    timed_out: bool = False
    """Killed at `wall_s`."""
    truncated: bool = False
    """Output was cut at `output_chars`."""

    @property
    def ok(self) -> bool:
        """Ran to the end without an error."""
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        """One observation for an agent: the output, then the error or why it stopped."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        if self.timed_out:
            parts.append("Error: the code ran too long and was stopped.")
        elif self.exit_code != 0:
            last = self.stderr.strip().splitlines()[-1:]
            if not last or self.exit_code < 0 or self.exit_code > 128:
                last = [_signal_text(self.exit_code)]
            parts.append(f"Error: {last[0]}")
        return "\n".join(parts) if parts else "(no output)"


def _signal_text(code: int) -> str:
    """Why a process ended with `code` (negative, or 128 + N from the sandbox's init: signal N)."""
    signal = -code if code < 0 else code - 128 if code > 128 else 0
    if signal == 9:
        return "killed: a limit was reached (CPU time, memory or processes)"
    if signal == 24:  # SIGXCPU
        return "stopped: CPU time limit reached"
    return f"exit status {code}"


def unavailable_reason() -> str | None:
    """Why sandboxes cannot run here (None: they can)."""
    for tool, package in (("bwrap", "bubblewrap"), ("prlimit", "util-linux")):
        if shutil.which(tool) is None:
            return (
                f"{tool} is not installed: apt-get install {package} (`make` installs it; "
                "docs/sandbox.md)"
            )
    return None


class PythonSandbox:
    """Runs Python source in a fresh, isolated interpreter per call (see the module doc)."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise SandboxUnavailable(f"the Python sandbox cannot run: {reason}")
        self.limits = limits or SandboxLimits()
        self._interpreter, self._prefix = _interpreter()
        self.cgroups = sandbox_cgroup.available()
        """Each call gets a memory cgroup; else `max_processes_without_cgroup` applies."""

    @property
    def max_processes(self) -> int:
        """The process limit in force (lower where memory is bounded per process only)."""
        limits = self.limits
        if self.cgroups:
            return limits.max_processes
        return min(limits.max_processes, limits.max_processes_without_cgroup)

    def run(self, code: str) -> SandboxResult:
        """Run `code` (the source of a script); its output and how it ended."""
        limits = self.limits
        with tempfile.TemporaryDirectory(prefix="agentgym-sandbox-") as folder:
            for name, text in (("main.py", code), ("start.py", self._start())):
                script = Path(folder) / name
                script.write_text(text, encoding="utf-8")
                script.chmod(0o644)
            Path(folder).chmod(0o755)
            command = self._command(Path(folder))
            cgroup = MemoryCgroup.make(limits.memory_mib * 2**20) if self.cgroups else None
            try:
                code, out, err, timed_out = self._run(command, cgroup)
            finally:
                if cgroup is not None:
                    cgroup.remove()  # once the sandbox's processes are gone
        if timed_out:
            return self._result(out, err, -9, timed_out=True)
        if code != 0 and b"bwrap:" in err.data[:400] and not out.data:
            raise SandboxUnavailable(
                "bubblewrap could not create the sandbox: "
                + err.data.decode(errors="replace").strip()[:400]
                + " (docs/sandbox.md: user namespaces must be allowed)"
            )
        return self._result(out, err, code)

    def _run(
        self, command: list[str], cgroup: MemoryCgroup | None
    ) -> tuple[int, Captured, Captured, bool]:
        """Start the sandbox (in `cgroup` before it runs anything), wait for it, read its output."""
        limits = self.limits
        if cgroup is not None:  # a shell that waits for a line on stdin, once it is in the cgroup
            command = ["/bin/sh", "-c", 'read -r _ && exec "$@"', "sh", *command]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if cgroup is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={},
            **self._as_unprivileged(),
        )
        # a character is at most 4 bytes of UTF-8: this many bytes always hold output_chars
        keep = limits.output_chars * 4 + 4
        stdout, stderr = _Capped(process.stdout, keep), _Capped(process.stderr, keep, tail=True)
        if cgroup is not None and process.stdin is not None:
            try:
                cgroup.join(process.pid)
            except OSError as error:
                process.kill()
                process.wait()
                raise SandboxUnavailable(f"could not join the sandbox's cgroup: {error}") from error
            with process.stdin:  # go; the sandbox's stdin then reads as empty
                process.stdin.write(b"\n")
        timed_out = False
        try:
            code = process.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            process.kill()  # bubblewrap; --die-with-parent takes the sandbox with it
            code, timed_out = process.wait(), True
        return code, stdout.result(), stderr.result(), timed_out

    def _command(self, folder: Path) -> list[str]:
        limits = self.limits
        mounts = ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "lib32", "sbin"):
            target = Path("/") / link
            if target.is_symlink():
                mounts += ["--symlink", os.readlink(target), f"/{link}"]
            elif target.is_dir():
                mounts += ["--ro-bind", str(target), f"/{link}"]
        if not _under(self._prefix, Path("/usr")):
            mounts += ["--ro-bind", str(self._prefix), str(self._prefix)]
        if not _under(self._interpreter, Path("/usr")) and not _under(
            self._interpreter, self._prefix
        ):
            mounts += ["--ro-bind", str(self._interpreter), str(self._interpreter)]
        scratch = str(limits.scratch_mib * 2**20)
        return [
            "prlimit",
            f"--as={limits.memory_mib * 2**20}",
            f"--cpu={limits.cpu_s}",
            f"--fsize={limits.file_mib * 2**20}",
            f"--nofile={limits.open_files}",
            "--",
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/scratch",
            "--hostname",
            "sandbox",
            *mounts,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            scratch,
            "--tmpfs",
            "/tmp",
            "--size",
            scratch,
            "--tmpfs",
            "/scratch",
            "--ro-bind",
            str(folder),
            "/sandbox",
            "--chdir",
            "/scratch",
            str(self._interpreter),
            "-I",
            "-B",
            "/sandbox/start.py",
        ]

    def _start(self) -> str:
        """The sandbox's first code: the process limit, then the script as `__main__`.

        RLIMIT_NPROC is set in here, not on bubblewrap: inside its own user
        namespace it counts only this sandbox's processes, so sandboxes run side
        by side never share the budget.
        """
        n = self.max_processes
        return (
            "import resource, runpy, sys\n"
            f"resource.setrlimit(resource.RLIMIT_NPROC, ({n}, {n}))\n"
            "sys.argv = ['main.py']\n"
            "del resource\n"
            "runpy.run_path('/sandbox/main.py', run_name='__main__')\n"
        )

    @staticmethod
    def _as_unprivileged() -> dict[str, object]:
        """Drop root before bubblewrap starts: an unprivileged user's limits then hold."""
        if os.geteuid() != 0:
            return {}
        return {"user": NOBODY, "group": NOBODY, "extra_groups": []}

    def _result(
        self, stdout: Captured, stderr: Captured, code: int, *, timed_out: bool = False
    ) -> SandboxResult:
        keep = self.limits.output_chars
        out = stdout.data.decode(errors="replace")
        err = stderr.data.decode(errors="replace")
        cut_out = stdout.dropped or len(out) > keep
        cut_err = stderr.dropped or len(err) > keep
        if cut_out:
            out = out[:keep] + f"\n... (output cut at {keep} characters)"
        if cut_err:
            err = "... (earlier error output cut)\n" + err[-keep:]
        return SandboxResult(out, err, code, timed_out=timed_out, truncated=cut_out or cut_err)


@dataclass(frozen=True)
class Captured:
    """What was kept of one output stream, and whether some was thrown away."""

    data: bytes
    dropped: bool


class _Capped:
    """Reads a child's stream to its end in a thread, keeping `keep` bytes of it.

    The first `keep` bytes (stdout: what the code printed first), or the last
    (`tail`, stderr: the traceback's end). The rest is read and thrown away as
    it comes, so a sandbox printing gigabytes costs this process `keep` bytes,
    and the child never blocks on a full pipe.
    """

    CHUNK = 1 << 16

    def __init__(self, stream: IO[bytes], keep: int, *, tail: bool = False) -> None:
        self._stream, self._keep, self._tail = stream, keep, tail
        self._data = bytearray()
        self._dropped = False
        self._thread = threading.Thread(target=self._read, daemon=True, name="sandbox-output")
        self._thread.start()

    def _read(self) -> None:
        with self._stream:
            while chunk := self._stream.read1(self.CHUNK):
                if self._tail:
                    self._data += chunk
                    if len(self._data) > 2 * self._keep:
                        del self._data[: -self._keep]
                        self._dropped = True
                elif len(self._data) < self._keep:
                    room = self._keep - len(self._data)
                    self._data += chunk[:room]
                    self._dropped |= len(chunk) > room
                else:
                    self._dropped = True

    def result(self, timeout_s: float = 10.0) -> Captured:
        """What was kept, once the stream ended (or, after `timeout_s`, what was kept by then)."""
        self._thread.join(timeout_s)
        data = bytes(self._data)
        if self._tail and len(data) > self._keep:
            data, self._dropped = data[-self._keep :], True
        return Captured(data, self._dropped)


SYSTEM_PYTHON = Path("/usr/bin/python3")


def _interpreter() -> tuple[Path, Path]:
    """The Python the sandbox runs, and its prefix (bound read-only).

    The system's `/usr/bin/python3` when there is one: the sandbox starts as an
    unprivileged user, who may not reach an interpreter under a home folder
    (pyenv's, a venv's base). Model-written code needs the standard library
    only. Else this process's own interpreter.
    """
    if SYSTEM_PYTHON.exists():
        return Path(os.path.realpath(SYSTEM_PYTHON)), Path("/usr")
    return Path(os.path.realpath(sys.executable)), Path(os.path.realpath(sys.base_prefix))


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
