"""Hostile programs for the sandbox. Each is a completion body for the problem `sq(x) -> x * x`.

Every one must earn 0 from code_exec and harm nothing. ``{MARK}`` is replaced by a per-test marker path prefix (under
/tmp, /var/tmp or the user's home) that must not exist afterwards.
"""

HOSTILE = {
    "sys_exit_before_tests": "import sys\nsys.exit(0)\ndef sq(x):\n    return 0\n",
    "os_exit_before_tests": "import os\nos._exit(0)\n",
    "os_exit_in_function": "import os\ndef sq(x):\n    os._exit(0)\n",
    "sys_exit_in_function": "def sq(x):\n    raise SystemExit(0)\n",
    "atexit_fake_success": (
        "import atexit, os, sys\n"
        "def fake():\n    os.write(3, b'{\"id\": 0, \"ops\": [\"Eq\"], \"values\": [[\"int\", 1], [\"int\", 1]]}\\n')\n"
        "atexit.register(fake)\ndef sq(x):\n    sys.exit(0)\n"
    ),
    "always_equal_object": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def sq(x):\n    return Anything()\n"
    ),
    "int_subclass_lies": "class Liar(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
                         "def sq(x):\n    return Liar(0)\n",
    "monkeypatch_builtins": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\ndef sq(x):\n    return None\n"
    ),
    "monkeypatch_json_and_os_write": (
        "import json, os\njson.dumps = lambda *a, **k: '{\"id\": 0, \"ops\": [\"truth\"], \"values\": [[\"bool\", true]]}'\n"
        "os.write = lambda fd, data: len(data)\ndef sq(x):\n    return -1\n"
    ),
    "forge_records_on_fds": (
        "import os\nfor fd in range(3, 20):\n    try:\n"
        "        os.write(fd, b'{\"id\": 0, \"ops\": [\"truth\"], \"values\": [[\"bool\", true]], \"n\": \"guess\"}\\n')\n"
        "    except OSError:\n        pass\ndef sq(x):\n    return -1\n"
    ),
    "posix_system": "import posix\nposix.system('touch {MARK}-system; sleep 60 &')\ndef sq(x):\n    return 0\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "setsid_grandchild": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(120)\n        open('{MARK}-late', 'w').write('x')\n    os._exit(0)\n"
        "def sq(x):\n    return 0\n"
    ),
    "memory_bomb": "x = bytearray(1 << 34)\ndef sq(x):\n    return x * x\n",
    "memory_bomb_growing": "x = []\nwhile True:\n    x.append(' ' * (1 << 20))\n",
    "infinite_loop": "while True:\n    pass\n",
    "infinite_loop_in_function": "def sq(x):\n    while True:\n        pass\n",
    "unbounded_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "unbounded_stderr": "import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n",
    "write_outside_workdir": (
        "for p in ['{MARK}-tmp', '/var/tmp/{NAME}-var', '/run/lock/{NAME}-lock', '/dev/shm/{NAME}-shm', "
        "'/root/{NAME}-root', '/etc/{NAME}-etc']:\n    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
        "def sq(x):\n    return 0\n"
    ),
    "network_connect": (
        "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', 22))\n"
        "def sq(x):\n    return x * x\n"
    ),
    "read_forbidden_files": (
        "data = open('/etc/shadow').read()\ndef sq(x):\n    return x * x\n"
    ),
    "read_own_tests": "import os\nprint(os.listdir('.'))\nsrc = open('job.json').read()\ndef sq(x):\n    return x * x\n",
    "huge_file": "open('big', 'wb').write(b'0' * (1 << 30))\ndef sq(x):\n    return x * x\n",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"
                   "def sq(x):\n    return 0\n",
}
