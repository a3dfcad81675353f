# The untrusted side of the code sandbox: run inside the sandbox as `python -I -S -c <wire.py + this file> REQ RESP`.
#
# It receives the model's program over the REQ pipe, runs it, then answers call requests ("call function NAME with
# these plain arguments") with the plain value returned or the name of the exception raised. It never receives a
# test, an expected value or a secret, so nothing the program does to this code (patching it, writing to the pipes
# itself, exiting early) can do more than claim a return value, which the trusted side then judges. In "program" mode
# (stdin/stdout tests) it closes the pipes and runs the program as a script.
#
# stdlib only, no package imports: the package is not visible inside the sandbox. Prepended by wire.py's source.


def _serve():
    import sys

    req, resp = int(sys.argv[1]), int(sys.argv[2])
    first = read_message(req)  # noqa: F821 (from wire.py, prepended)
    if not first or type(first.get("code")) is not str:
        return
    code = first["code"]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    if first.get("mode") == "program":
        os.close(req)  # noqa: F821
        os.close(resp)  # noqa: F821
        exec(compile(code, "solution.py", "exec"), namespace)
        return
    try:
        exec(compile(code, "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 (anything the program raises, SystemExit included, is a failed load)
        write_message(resp, {"loaded": False, "error": type(exc).__name__})  # noqa: F821
        return
    write_message(resp, {"loaded": True})  # noqa: F821
    while True:
        message = read_message(req)  # noqa: F821
        if message is None:
            return
        seq = message.get("seq")
        try:
            function = namespace[message["name"]]
            args = decode(message["args"])  # noqa: F821
            kwargs = decode(message["kwargs"])  # noqa: F821
            answer = {"seq": seq, "value": encode(function(*args, **kwargs))}  # noqa: F821
        except BaseException as exc:  # noqa: BLE001
            answer = {"seq": seq, "raised": type(exc).__name__}
        write_message(resp, answer)  # noqa: F821


_serve()
