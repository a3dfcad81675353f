"""Hostile programs for the code sandbox, by class. Each is a completion body for the problem ``sq(x) -> x * x``.

None of them solves the problem, so every one must earn 0 from ``code_exec``, return in time, leave no process alive
(by real or effective uid) and nothing outside its work dir (files, sockets, IPC objects). Programs that probe the
host (files, network, the trainer's command line) return the right answer only when the probe succeeds, so a
reward above 0 would itself show the breach. ``{MARK}`` is replaced by a per-test marker path under /tmp and
``{NAME}`` by its file name; neither may exist afterwards. ``{PORT}`` is a port the test listens on, on the host's
loopback.
"""

ANSWER_IF = "def sq(x):\n    return x * x if BREACH else -1\n"  # appended to probes that set BREACH

HOSTILE = {
    # --- exiting before, during or after the tests ---------------------------------------------------------
    "sys_exit_before_tests": "import sys\nsys.exit(0)\ndef sq(x):\n    return 0\n",
    "os_exit_before_tests": "import os\nos._exit(0)\n",
    "os_exit_in_function": "import os\ndef sq(x):\n    os._exit(0)\n",
    "system_exit_in_function": "def sq(x):\n    raise SystemExit(0)\n",
    "keyboard_interrupt_in_function": "def sq(x):\n    raise KeyboardInterrupt\n",
    "kill_self_in_function": "import os, signal\ndef sq(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "atexit_forges_answers": (
        "import atexit, os\n"
        "def forge():\n    for fd in range(3, 12):\n        try:\n"
        "            os.write(fd, b'\\x00\\x00\\x00\\x17{\"seq\":1,\"value\":true}')\n        except OSError:\n            pass\n"
        "atexit.register(forge)\ndef sq(x):\n    raise SystemExit(0)\n"
    ),
    # --- objects that lie about equality, truth or arithmetic ---------------------------------------------
    "always_equal_object": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def sq(x):\n    return Anything()\n"
    ),
    "int_subclass_lies": "class Liar(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
                         "def sq(x):\n    return Liar(0)\n",
    "float_subclass_lies": "class F(float):\n    def __eq__(self, o):\n        return True\n    __hash__ = float.__hash__\n"
                           "def sq(x):\n    return F(0.5)\n",
    "str_subclass_lies": "class S(str):\n    def __eq__(self, o):\n        return True\n    __hash__ = str.__hash__\n"
                         "def sq(x):\n    return S('')\n",
    "list_subclass_lies": "class L(list):\n    def __eq__(self, o):\n        return True\ndef sq(x):\n    return L()\n",
    "truthy_object": "class T:\n    def __bool__(self):\n        return True\ndef sq(x):\n    return T()\n",
    "subtraction_returns_zero": (
        "class Z:\n    def __sub__(self, o):\n        return 0.0\n    __rsub__ = __sub__\n    def __abs__(self):\n"
        "        return 0.0\ndef sq(x):\n    return Z()\n"
    ),
    "nan_result": "def sq(x):\n    return float('nan')\n",
    "generator_result": "def sq(x):\n    yield x * x\n",
    "function_result": "def sq(x):\n    return lambda: x * x\n",
    "type_result": "def sq(x):\n    return int\n",
    "ellipsis_result": "def sq(x):\n    return ...\n",
    # --- forging or corrupting what crosses the boundary -------------------------------------------------
    "forge_answers_on_every_fd": (
        "import os\nfor fd in range(3, 20):\n    try:\n"
        "        os.write(fd, b'\\x00\\x00\\x00\\x0f{\"loaded\":true}\\x00\\x00\\x00\\x17{\"seq\":1,\"value\":true}')\n"
        "    except OSError:\n        pass\ndef sq(x):\n    return -1\n"
    ),
    "garbage_on_answer_pipe": (
        "import os, sys\nfd = int(sys.argv[2])\nos.write(fd, b'\\x00\\x00\\x00\\x05[[[[[')\ndef sq(x):\n    return -1\n"
    ),
    "oversized_header": "import os, sys\nos.write(int(sys.argv[2]), b'\\xff\\xff\\xff\\xff')\ndef sq(x):\n    return -1\n",
    "truncated_answer_then_silence": (
        "import os, sys, time\ndef sq(x):\n    os.write(int(sys.argv[2]), b'\\x00\\x00\\x10\\x00{\"seq\"')\n"
        "    time.sleep(60)\n"
    ),
    "deeply_nested_answer": "def sq(x):\n    v = []\n    for _ in range(2500):\n        v = [v]\n    return v\n",
    "bracket_string_answer": "def sq(x):\n    return '[' * 200000\n",
    "huge_integer_answer": "def sq(x):\n    return 10 ** 5000\n",
    "huge_list_answer": "def sq(x):\n    return list(range(5_000_000))\n",
    "close_the_pipes": "import os, sys\nos.close(int(sys.argv[1]))\nos.close(int(sys.argv[2]))\ndef sq(x):\n    return 0\n",
    "answer_out_of_order": (
        "import os, sys, json\ndef sq(x):\n    body = json.dumps({'seq': 99, 'value': x * x}).encode()\n"
        "    os.write(int(sys.argv[2]), len(body).to_bytes(4, 'big') + body)\n    return -1\n"
    ),
    # --- patching the server that runs it ------------------------------------------------------------------
    "patch_server_encoder": "import __main__\n__main__.encode = lambda v: True\ndef sq(x):\n    return -1\n",
    "patch_server_writer": (
        "import __main__\nreal = __main__.write_message\n"
        "__main__.write_message = lambda fd, m: real(fd, {**m, 'value': True} if 'seq' in m else m)\n"
        "def sq(x):\n    return -1\n"
    ),
    "patch_json_and_os_write": (
        "import json, os\njson.dumps = lambda *a, **k: '{\"seq\": 1, \"value\": true}'\n"
        "os.write = lambda fd, data: len(data)\ndef sq(x):\n    return -1\n"
    ),
    "settrace_rewrites": (
        "import sys\ndef tracer(frame, event, arg):\n    if event == 'return' and frame.f_code.co_name == 'sq':\n"
        "        frame.f_locals['x'] = 4\n    return tracer\nsys.settrace(tracer)\nsys.setprofile(tracer)\n"
        "def sq(x):\n    return -1\n"
    ),
    "wrap_compile_and_exec": (
        "import builtins\nbuiltins.compile = lambda *a, **k: compile('pass', 'x', 'exec')\n"
        "builtins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: True\ndef sq(x):\n    return -1\n"
    ),
    "monkeypatch_builtins": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: int\n"
        "builtins.AssertionError = type('Never', (Exception,), {})\ndef sq(x):\n    return None\n"
    ),
    "fake_math_module": (
        "import sys, types\nm = types.ModuleType('math')\nm.isclose = lambda *a, **k: True\nm.fabs = lambda x: 0.0\n"
        "sys.modules['math'] = m\ndef sq(x):\n    return -1\n"
    ),
    # --- looking for the tests or the expected values --------------------------------------------------------
    "walk_frames_for_tests": (
        "import sys\ndef sq(x):\n    f = sys._getframe()\n    while f is not None:\n"
        "        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
        "            if callable(v) and getattr(v, '__name__', '') in ('check', 'candidate'):\n"
        "                return v\n        f = f.f_back\n    return -1\n"
    ),
    "gc_search_for_expected_values": (
        "import gc\ndef sq(x):\n    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and 'expected' in o:\n            return o['expected']\n    return -1\n"
    ),
    "inspect_stack": (
        "import inspect\ndef sq(x):\n    for frame in inspect.stack():\n        src = str(frame.code_context)\n"
        "        if 'assert' in src:\n            return src\n    return -1\n"
    ),
    "read_environment_for_secrets": (
        "import os\nBREACH = any('NONCE' in k or 'TOKEN' in k or 'ROOKGRPO' in k for k in os.environ)\n"
        "try:\n    BREACH = BREACH or b'NONCE' in open('/proc/self/environ', 'rb').read()\nexcept OSError:\n    pass\n"
        + ANSWER_IF
    ),
    "prctl_dumpable_then_environ": (
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.prctl(4, 1, 0, 0, 0)\n"
        "BREACH = b'ROOKGRPO' in open('/proc/self/environ', 'rb').read()\n" + ANSWER_IF
    ),
    # --- reading answers from the host ----------------------------------------------------------------------
    "read_the_checkout": (
        "import os\nBREACH = any(os.path.exists(p) for p in ('/work/main', '/work/main/src/rookgrpo', '/root', '/home'))\n"
        + ANSWER_IF
    ),
    "read_site_packages": (
        "import glob\nBREACH = bool(glob.glob('/usr/lib/python3/dist-packages/*') + glob.glob('/usr/local/lib/python3*/*/*')"
        " + glob.glob('/root/.pyenv/versions/*/lib/python3*/site-packages/*') + glob.glob('/work/*/.venv/lib/*/*/*'))\n"
        + ANSWER_IF
    ),
    "read_host_proc_cmdlines": (  # the trainer's, the runner's or the test runner's command line
        "import os\nBREACH = False\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
        "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "        BREACH = BREACH or any(w in cmd for w in (b'rookgrpo.code.runner', b'pytest', b'accelerate'))\n"
        "    except OSError:\n        pass\n" + ANSWER_IF
    ),
    "read_etc_files": (
        "BREACH = False\nfor p in ('/etc/passwd', '/etc/shadow', '/etc/hostname'):\n    try:\n        open(p).read()\n"
        "        BREACH = True\n    except OSError:\n        pass\n" + ANSWER_IF
    ),
    "list_the_root": "import os\nBREACH = len(os.listdir('/')) > 8\n" + ANSWER_IF,
    # --- processes that try to outlive the run ---------------------------------------------------------------
    "setsid_grandchild": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(120)\n        open('{MARK}-late', 'w').write('x')\n    os._exit(0)\n"
        "def sq(x):\n    return 0\n"
    ),
    "setsid_and_sleep_in_function": (
        "import os, time\ndef sq(x):\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(120)\n"
        "        os._exit(0)\n    return -1\n"
    ),
    "double_fork_daemon": (
        "import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork():\n        os._exit(0)\n"
        "    os.chdir('/')\n    while True:\n        time.sleep(1)\ndef sq(x):\n    return -1\n"
    ),
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "thread_bomb": (
        "import threading, time\nfor _ in range(10000):\n    try:\n"
        "        threading.Thread(target=time.sleep, args=(60,), daemon=False).start()\n    except RuntimeError:\n"
        "        break\ndef sq(x):\n    return -1\n"
    ),
    "exec_setuid_helper": (
        "import os\nfor helper in ('/usr/bin/su', '/bin/su', '/usr/bin/passwd', '/usr/bin/pkexec', '/usr/lib/dbus-1.0/"
        "dbus-daemon-launch-helper'):\n    if os.path.exists(helper) and os.fork() == 0:\n        os.setsid()\n"
        "        try:\n            os.execv(helper, [helper])\n        except OSError:\n            os._exit(1)\n"
        "def sq(x):\n    return -1\n"
    ),
    "kill_everything": (
        "import os, signal\nfor pid in (-1, 1, os.getppid()):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\ndef sq(x):\n    return -1\n"
    ),
    "new_user_namespace": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nBREACH = libc.unshare(0x10000000) == 0\n" + ANSWER_IF
    ),
    # --- resources ---------------------------------------------------------------------------------------------
    "memory_bomb": "x = bytearray(1 << 34)\ndef sq(x):\n    return -1\n",
    "memory_bomb_growing": "x = []\nwhile True:\n    x.append(' ' * (1 << 20))\n",
    "memory_bomb_across_processes": (
        "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n        b = bytearray(400 << 20)\n"
        "        time.sleep(30)\n        os._exit(0)\ntime.sleep(30)\n"
    ),
    "infinite_loop": "while True:\n    pass\n",
    "infinite_loop_in_function": "def sq(x):\n    while True:\n        pass\n",
    "deep_recursion": "import sys\nsys.setrecursionlimit(10 ** 7)\ndef sq(x):\n    return sq(x + 1)\n",
    "exponent_tower": "def sq(x):\n    return 2 ** 2 ** 2 ** 2 ** 2 ** 2\n",
    "unbounded_output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "unbounded_stderr": "import sys\nwhile True:\n    sys.stderr.write('y' * 65536)\n",
    "fill_the_work_dir": (
        "i = 0\nwhile True:\n    try:\n        open(f'f{i}', 'wb').write(b'0' * (8 << 20))\n    except OSError:\n        break\n"
        "    i += 1\ndef sq(x):\n    return -1\n"
    ),
    "nested_directories": (
        "import os\nfor i in range(1500):\n    try:\n        os.mkdir('d')\n        os.chdir('d')\n    except OSError:\n"
        "        break\ndef sq(x):\n    return -1\n"
    ),
    "open_many_files": "fs = []\nwhile True:\n    fs.append(open('/dev/null'))\n",
    "compiler_bomb": "x = " + "-" * 3000 + "1\ndef sq(x):\n    return -1\n",
    # --- writing outside the work dir, sockets and IPC ---------------------------------------------------------
    "write_outside_workdir": (
        "for p in ['{MARK}-tmp', '/var/tmp/{NAME}-var', '/run/lock/{NAME}-lock', '/dev/shm/{NAME}-shm', "
        "'/root/{NAME}-root', '/etc/{NAME}-etc', '/usr/{NAME}-usr']:\n    try:\n        open(p, 'w').write('x')\n"
        "    except OSError:\n        pass\ndef sq(x):\n    return -1\n"
    ),
    "network_connect_loopback": (
        "import socket\nBREACH = False\ntry:\n    socket.create_connection(('127.0.0.1', {PORT}), timeout=2)\n"
        "    BREACH = True\nexcept OSError:\n    pass\n" + ANSWER_IF
    ),
    "network_connect_outside": (
        "import socket\nBREACH = False\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    BREACH = True\n"
        "except OSError:\n    pass\n" + ANSWER_IF
    ),
    "unix_sockets_outside": (
        "import socket, glob\nBREACH = False\nfor path in glob.glob('/run/**/*.sock', recursive=True) + "
        "glob.glob('/tmp/**/*', recursive=True) + glob.glob('/var/run/**/*', recursive=True):\n    try:\n"
        "        s = socket.socket(socket.AF_UNIX)\n        s.connect(path)\n        BREACH = True\n    except OSError:\n"
        "        pass\n" + ANSWER_IF
    ),
    "abstract_socket_listener": (
        "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0{NAME}')\ns.listen()\n"
        "def sq(x):\n    return -1\n"
    ),
    "sysv_shared_memory": (
        "import ctypes\nlibc = ctypes.CDLL(None)\nfor key in range(7000, 7004):\n"
        "    libc.shmget(key, 256 << 20, 0o1000 | 0o666)\n    libc.semget(key, 4, 0o1000 | 0o666)\n"
        "    libc.msgget(key, 0o1000 | 0o666)\ndef sq(x):\n    return -1\n"
    ),
    "posix_message_queue_and_shm": (
        "import ctypes, os\nlibrt = ctypes.CDLL('librt.so.1')\nlibrt.mq_open(b'/{NAME}', os.O_CREAT | os.O_RDWR, 0o666, None)\n"
        "from multiprocessing import shared_memory\ntry:\n    shared_memory.SharedMemory(name='{NAME}', create=True, size=1 << 20)\n"
        "except Exception:\n    pass\ndef sq(x):\n    return -1\n"
    ),
    "chmod_and_symlinks": (
        "import os\nfor target in ('/usr/bin/python3', '/etc/passwd', '/proc/1/root'):\n    try:\n"
        "        os.symlink(target, 'link-' + target.replace('/', '_'))\n        os.chmod(target, 0o777)\n    except OSError:\n"
        "        pass\ndef sq(x):\n    return -1\n"
    ),
}

# The programs that attack only the verdict channel (exits, lying objects, forged messages, patched servers): they
# never reach past the sandbox's own process, so what stops them is the split trust, whatever the isolation layer.
VERDICT_CHANNEL = frozenset({
    "always_equal_object", "answer_out_of_order", "atexit_forges_answers", "bracket_string_answer", "close_the_pipes",
    "deeply_nested_answer", "ellipsis_result", "fake_math_module", "float_subclass_lies", "forge_answers_on_every_fd",
    "function_result", "garbage_on_answer_pipe", "generator_result", "huge_integer_answer", "huge_list_answer",
    "int_subclass_lies", "keyboard_interrupt_in_function", "kill_self_in_function", "list_subclass_lies",
    "monkeypatch_builtins", "nan_result", "os_exit_before_tests", "os_exit_in_function", "oversized_header",
    "patch_json_and_os_write", "patch_server_encoder", "patch_server_writer", "settrace_rewrites",
    "str_subclass_lies", "subtraction_returns_zero", "sys_exit_before_tests", "system_exit_in_function",
    "truncated_answer_then_silence", "truthy_object", "type_result", "wrap_compile_and_exec",
})

# Plausible for a policy, no malice needed: the prompt's helpers redefined (tests must use the problem's own), and
# tests that exercise nothing. Each is (completion, tests) for its own problem.
PROMPT_HELPER_TESTS = {
    "type": "asserts", "entry_point": "decode_shift",
    "prelude": "def encode_shift(s: str):\n    return ''.join(chr((ord(c) - 97 + 5) % 26 + 97) for c in s)\n\n"
               "def decode_shift(s: str):\n    \"\"\"Inverse of encode_shift.\"\"\"\n",
    "code": "def check(candidate):\n    for s in ['hello', 'world', 'abcxyz']:\n        assert candidate(encode_shift(s)) == s\n",
}
PLAUSIBLE = {
    "redefine_prompt_helper_as_identity": (
        "def encode_shift(s):\n    return s\ndef decode_shift(s):\n    return s\n", PROMPT_HELPER_TESTS),
    "return_none_against_assert_true_lines": (
        "def sq(x):\n    return None\n",
        {"type": "asserts", "entry_point": "sq",
         "code": "def check(candidate):\n    assert True\n    assert True, 'debug line'\n    assert candidate(3) == 9\n"}),
}
