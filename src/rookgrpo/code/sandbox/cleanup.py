"""Cleanup after a sandboxed program where no namespace takes its leftovers away: processes found and killed by
uid, files and IPC objects a uid left in shared places, the work dir removed without following links, and orphans
reaped by the runner that adopted them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .layers import PR_SET_CHILD_SUBREAPER, _libc

def processes_of_uids(uids: set[int], zombies: bool = False) -> list[tuple[int, str]]:
    """(pid, name) of processes whose real or effective uid is in ``uids`` (from /proc); zombies only if asked
    (then as (pid, "name (zombie of PPID)"), so a caller can tell whose child it is)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        real, effective = (int(x) for x in fields.get("Uid", "-1 -1").split()[:2])
        zombie = "Z" in fields.get("State", "")
        if (real in uids or effective in uids) and (zombies or not zombie):
            name = fields.get("Name", "").strip()
            found.append((int(entry), f"{name} (zombie of {fields.get('PPid', '?').strip()})" if zombie else name))
    return found


def remove_tree(path: str) -> None:
    """``rm -rf --one-file-system``: symlinks removed, not followed; no other mount entered; any depth (a program may
    nest directories 1,500 deep, past ``shutil.rmtree``'s recursion). By absolute path: PATH may lack ``rm``."""
    rm = next((p for p in ("/usr/bin/rm", "/bin/rm") if os.access(p, os.X_OK)), None)
    if rm is not None:
        subprocess.run([rm, "-rf", "--one-file-system", path], capture_output=True)
    else:
        try:
            shutil.rmtree(path, ignore_errors=True)
        except RecursionError:
            pass


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
IPC_RMID = 0


def remove_uid_leftovers(uid: int) -> int:
    """Remove what a sandbox uid left where any user may write (``SHARED_WRITABLE``: files, directories, sockets,
    POSIX shared memory and queues) and its SysV IPC objects (never uid 0). Returns how many were removed. For reduced
    isolation without namespaces, where nothing else would take them away."""
    if uid <= 0:
        return 0
    removed = 0
    for top in SHARED_WRITABLE:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    libc = _libc()
    for kind, remove in (("shm", lambda i: libc.shmctl(i, IPC_RMID, None)),
                         ("sem", lambda i: libc.semctl(i, 0, IPC_RMID)),
                         ("msg", lambda i: libc.msgctl(i, IPC_RMID, None))):
        try:
            header, *rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        names = header.split()
        for row in rows:
            fields = dict(zip(names, row.split()))
            if int(fields.get("uid", -1)) == uid or int(fields.get("cuid", -1)) == uid:
                ident = int(fields.get("shmid") or fields.get("semid") or fields.get("msqid") or -1)
                if ident >= 0 and remove(ident) == 0:
                    removed += 1
    return removed


def kill_uid(uid: int) -> None:
    """Kill every process whose real or effective uid is ``uid`` (never 0)."""
    if uid <= 0:
        return
    for _ in range(20):
        found = processes_of_uids({uid})
        if not found:
            return
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def become_subreaper() -> None:
    """Adopt orphaned descendants (a killed sandbox's namespace init) so :func:`reap_orphans` can reap them."""
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans() -> int:
    """Reap every finished child of this process (call only in a process whose children are all sandboxes)."""
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1
