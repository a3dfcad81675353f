"""Start and tear down the process that runs untrusted, model-written Python.

This module only isolates; it never judges. The program runs in a fresh sandbox that holds no test, expected value or
secret; the trusted test runner (:mod:`rookgrpo.code.runner`, its own process) talks to it over two pipes in plain data
(:mod:`rookgrpo.code.wire`) and decides every verdict. Layers, outermost first (``docs/sandbox.md`` says what each
stops and what remains):

- **bubblewrap** (``bwrap``, Debian's ``bubblewrap``): new user, PID (with its own ``/proc``), IPC, network, UTS and
  cgroup namespaces; a filesystem view of the interpreter and its stdlib read-only, a minimal ``/dev``, and a fresh
  size-capped tmpfs work dir, so the checkout, site-packages, the data set, the host's ``/tmp`` and its Unix sockets
  do not exist; ``no_new_privs`` (setuid binaries cannot raise privileges); ``--die-with-parent``; when the program's
  first process exits, the kernel kills everything left in its PID namespace (``setsid`` and fork escapes included),
  and its IPC objects vanish with the namespace.
- **an unprivileged uid** (as root: one per runner worker). With bubblewrap the spawn drops the uid in C (no Python
  runs between fork and exec) and bwrap then sets ``no_new_privs`` and its parent-death signal; otherwise the child
  sets ``no_new_privs`` before the uid change and the parent-death signal after it (a uid change clears it).
- **a cgroup** per run where the machine lets us create one (v1 ``memory`` + ``pids`` or v2): memory and process
  limits for the whole process tree, and a way to kill every process of the run.
- **rlimits** per process: address space, CPU time, file size, open files, processes, no core dumps; set by the
  sandbox's first process before it reads the program (or before exec without bubblewrap).
- **a wall-clock timeout** enforced by the caller, which kills the process group, the cgroup and the namespace.

It fails closed. Without bubblewrap (or without user namespaces) a :class:`Sandbox` refuses to start
(:class:`SandboxUnavailable`, a ``ConfigError`` naming what is missing, the fix and the opt-in) unless its caller
accepts reduced isolation on purpose (``isolation="reduced"``; ``code_sandbox_isolation: reduced`` in a recipe).
Reduced isolation keeps the layers below and, where the process is root, rebuilds the filesystem view, network and IPC
isolation itself (:func:`.layers._enter_namespaces`: new mount, network, IPC and UTS namespaces, no user namespace needed);
what a pid namespace and a non-root run would add is lost, and :func:`isolation` says so.

The package, by concern: :mod:`.layers` (the isolation layers, and how a program enters them), :mod:`.limits`
(rlimits, cgroups, sandbox uids), :mod:`.program` (one sandboxed program: its spawn, the job protocol over its pipes,
and the probe of which layers work here) and :mod:`.cleanup` (what is removed by uid where no namespace takes it
away). Import from here.
"""

from .cleanup import (SHARED_WRITABLE, become_subreaper, kill_uid, processes_of_uids, reap_orphans, remove_tree,
                      remove_uid_leftovers)
from .layers import (FIX_NO_BWRAP, FIX_NO_USERNS, ISOLATION_MODES, OPT_IN, VIEW_DEVICES, VIEW_TOP, Isolation,
                     SandboxUnavailable, check_mode, landlock_abi)
from .limits import (CGROUP_PREFIX, SANDBOX_UID_BASE, UID_BASE_ENV, UIDS_PER_JOB, UIDS_PER_PROCESS, Cgroup,
                     SandboxLimits, give_back_cgroup, next_sandbox_uid, remove_cgroups, remove_stale_cgroups, rlimits,
                     sandbox_uid_base, take_cgroup)
from .program import BOOTSTRAP, SERVER_SOURCE, Sandbox, isolation, require, server_code

__all__ = [
    "BOOTSTRAP", "CGROUP_PREFIX", "FIX_NO_BWRAP", "FIX_NO_USERNS", "ISOLATION_MODES", "OPT_IN", "SANDBOX_UID_BASE",
    "SERVER_SOURCE", "SHARED_WRITABLE", "UIDS_PER_JOB", "UIDS_PER_PROCESS", "UID_BASE_ENV", "VIEW_DEVICES", "VIEW_TOP",
    "Cgroup", "Isolation", "Sandbox", "SandboxLimits", "SandboxUnavailable", "become_subreaper", "check_mode",
    "give_back_cgroup", "isolation", "kill_uid", "landlock_abi", "next_sandbox_uid", "processes_of_uids",
    "reap_orphans", "remove_cgroups", "remove_stale_cgroups", "remove_tree", "remove_uid_leftovers", "require",
    "rlimits", "sandbox_uid_base", "server_code", "take_cgroup",
]
