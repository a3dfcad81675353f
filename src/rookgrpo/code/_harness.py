"""Runs inside the sandbox: isolate, drop privileges, run the untrusted code, report results. Stdlib only.

Started as ``python -I -S _harness.py WORKDIR RESULT_FD`` (inside fresh net/pid/mount namespaces when available).
Reads ``WORKDIR/job.json``. Results go to RESULT_FD as JSON lines tagged with a per-run nonce. The nonce comes in
the environment and is removed from it before any untrusted code runs. The parent decides pass/fail from these
records. The exit code counts for nothing.
"""

import ctypes
import json
import os
import resource
import sys

_type, _repr, _len, _isinstance = type, repr, len, isinstance
_write, _dumps = os.write, json.dumps
_NONE = type(None)
_MAX_ITEMS = 100_000


class _Unserializable(Exception):
    pass


def _ser(value, budget):
    """Strict serialization: exact builtin types only (a subclass, e.g. an int with a lying __eq__, is rejected)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Unserializable("value too large")
    t = _type(value)
    if t is _NONE or t is bool or t is int or t is str:
        return [t.__name__, value]
    if t is float:
        return ["float", _repr(value)]
    if t is complex:
        return ["complex", [_repr(value.real), _repr(value.imag)]]
    if t is list or t is tuple or t is set or t is frozenset:
        return [t.__name__, [_ser(x, budget) for x in value]]
    if t is dict:
        return ["dict", [[_ser(k, budget), _ser(v, budget)] for k, v in value.items()]]
    if t is bytes:
        return ["bytes", list(value)]
    raise _Unserializable(f"type {t.__name__}")


def _traversable_by_others(path):
    parts = os.path.abspath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:i]) or os.sep
        if not os.stat(prefix).st_mode & 0o001:
            return False
    return True


def _expose_stdlib(libc, flags):
    """The interpreter's stdlib may sit where the sandbox uid cannot go (e.g. /root/.pyenv, mode 0700). Bind it at
    /mnt inside this mount namespace (invisible outside) and point sys.path there, so imports keep working."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    if _traversable_by_others(stdlib) or not os.path.isdir("/mnt"):
        return
    if libc.mount(stdlib.encode(), b"/mnt", None, flags, None) != 0:
        return
    moved = lambda p: "/mnt" + p[len(stdlib):] if isinstance(p, str) and p.startswith(stdlib) else p  # noqa: E731
    sys.path[:] = [moved(p) for p in sys.path]
    for module in list(sys.modules.values()):  # packages imported already look for submodules via __path__
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            path[:] = [moved(p) for p in path]
    sys.path_importer_cache.clear()


def _isolate(workdir, uid, nproc):
    """As root inside a mount namespace: make every world-writable dir the work dir, then drop to ``uid``.

    Returns the work dir's path from now on: ``/tmp`` once the work dir is mounted there (its old path under /tmp
    is hidden by that very mount).
    """
    if os.getuid() != 0:
        return workdir
    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec = 4096, 16384
    fd = os.open(workdir, os.O_RDONLY)  # keep a handle: the path disappears once /tmp is covered
    source = f"/proc/self/fd/{fd}".encode()
    mounted = []
    for target in (b"/tmp", b"/var/tmp", b"/run/lock", b"/dev/shm"):
        if os.path.isdir(target) and libc.mount(source, target, None, ms_bind | ms_rec, None) == 0:
            mounted.append(target.decode())
    os.close(fd)
    _expose_stdlib(libc, ms_bind | ms_rec)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # from here on: no capabilities, and RLIMIT_NPROC binds
    return "/tmp" if "/tmp" in mounted else workdir


def main():
    workdir, result_fd = sys.argv[1], int(sys.argv[2])
    nonce = os.environ.pop("ROOKGRPO_SANDBOX_NONCE", "")
    uid, nproc = int(os.environ.pop("ROOKGRPO_SANDBOX_UID", "65534")), int(os.environ.pop("ROOKGRPO_SANDBOX_NPROC", "32"))
    with open(os.path.join(workdir, "job.json")) as fh:
        job = json.load(fh)
    os.remove(os.path.join(workdir, "job.json"))  # the program must not read its tests
    workdir = _isolate(workdir, uid, nproc)
    os.chdir(workdir)
    os.environ["HOME"] = workdir

    def report(record):
        record["n"] = nonce
        try:
            _write(result_fd, (_dumps(record) + "\n").encode())
        except OSError:
            pass

    def compare(test_id, ops, thunk):
        try:
            values = thunk()
            budget = [_MAX_ITEMS]
            report({"id": test_id, "ops": ops, "values": [_ser(v, budget) for v in values]})
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: a test that exits fails
            report({"id": test_id, "error": _type(exc).__name__})

    def truth(test_id, thunk):
        compare(test_id, ["truth"], lambda: (thunk(),))

    namespace = {"__name__": "__main__" if job["mode"] == "program" else "solution", "__builtins__": __builtins__}
    report({"event": "start"})
    if job["mode"] == "program":  # stdin/stdout: the parent compares what it printed
        exec(compile(job["code"], "solution.py", "exec"), namespace)
        return
    try:
        exec(compile(job["code"], "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001
        report({"event": "import_error", "error": _type(exc).__name__})
        return
    if job["mode"] == "calls":
        func = namespace.get(job["entry_point"])
        for i, args in enumerate(job["calls"]):
            compare(i, ["call"], lambda args=args: (func(*args),))
        return
    # asserts: the parent rewrote each `assert` into __rk_compare__/__rk_truth__ calls with stable ids.
    namespace["__rk_compare__"], namespace["__rk_truth__"] = compare, truth
    try:
        exec(compile(job["tests"], "tests.py", "exec"), namespace)
        check = namespace.get("check")
        if job.get("entry_point") and callable(check):
            check(namespace[job["entry_point"]])
    except BaseException as exc:  # noqa: BLE001 - tests after this point have no record and fail
        report({"event": "tests_error", "error": _type(exc).__name__})


if __name__ == "__main__":  # run as a script by the sandbox; importing it (e.g. doctest collection) does nothing
    main()
