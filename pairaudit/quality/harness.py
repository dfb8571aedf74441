"""The sandbox's harness: the only code that runs in the sandboxed child before the model's.

:mod:`pairaudit.quality.sandbox` runs this file's text as ``python -I -S -c
<text> <job fd>`` inside the sandbox (docs/sandbox.md). That child sees no
project tree and no site-packages (bubblewrap binds only the interpreter's
prefix and the system libraries; ``-I -S``), so the harness imports the
standard library alone, and only inside ``_pa_main``, which is gone from
``__main__`` before the program runs. It reads the job (code, tests, nonce,
limits) from an inherited descriptor and closes it, so nothing secret is in
argv, the environment or a file the program could read. The sandbox module's
docstring says what the harness guards against, and what it cannot.

No ``from __future__`` import here: ``compile`` inherits the caller's future
flags, and the program must be compiled as the interpreter alone would.
"""


def _pa_main():
    import builtins
    import marshal
    import os
    import resource
    import sys
    fd = int(sys.argv[1])
    parts = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        parts.append(chunk)
    os.close(fd)
    job = marshal.loads(b"".join(parts))
    del parts
    for name, lim in job["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (lim[0], lim[1]))
    if job["uid"] is not None:
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
    if job["mode"] == "program":
        return job["code"]

    # Installed before any model code: every later audit hook is refused
    # (sys.addaudithook does not add a hook when an existing one raises), so
    # the program cannot watch the harness compile and run the tests, nor
    # re-patch what the harness restores each time an audited event fires.
    def _refuse_hooks(event, args):
        if event == "sys.addaudithook":
            raise RuntimeError("the scoring harness allows no audit hooks")

    sys.addaudithook(_refuse_hooks)
    import gc
    _write, _exit, _repr, _exec, _eval, _compile = os.write, os._exit, repr, exec, eval, compile
    _settrace, _setprofile, _modules = sys.settrace, sys.setprofile, sys.modules
    _BaseException, _type, _str, _dict, _list, _len = BaseException, type, str, dict, list, len
    _join = str.join
    _listdir = os.listdir
    rfd, nonce, imports = job["result_fd"], job["nonce"], "\n".join(job["imports"])
    code, tests, keep = job["code"], job["tests"], set(job["keep"])
    # "calls" mode (the split path, pairaudit/quality/split.py): no tests and no
    # nonce are here; the host sends one call expression at a time on cmd_fd
    # and judges each reply itself.
    calls_mode = job["mode"] == "calls"
    cfd, alias, plain_caps = job.get("cmd_fd"), job.get("alias") or {}, job.get("plain_caps")
    call_imports = "\n".join(job.get("call_imports") or [])
    job = None

    def fmt(exc):
        # str.join returns an exact str whatever str subclasses the program's
        # exception hands back, so no __repr__/__add__ of the program's can
        # shape the report's text (e.g. close the list and add "failed": []).
        try:
            return _join("", [_type(exc).__name__, ": ", _str(exc)])[:300]
        except _BaseException:
            return "unprintable exception"

    def send(data):
        while data:
            data = data[_write(rfd, data):]

    def frame(seq, token, kind, text):
        # One reply of the calls protocol: "<length>\n<seq> <token> <kind>\n<text>".
        body = _join("", [_str(seq), " ", token, " ", kind, "\n", text]).encode("utf-8", "backslashreplace")
        send(_str(_len(body)).encode("ascii") + b"\n" + body)

    def report(doc):
        try:
            if calls_mode:
                frame(-1, "-", "solution", _repr(doc))
            else:
                send((nonce + " " + _repr(doc) + "\n").encode("utf-8"))
        except _BaseException:
            _exit(1)
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except _BaseException:
                pass

    # The calls protocol's encoder: a call's result becomes plain data (the
    # built-in literal types, checked by exact type, recursively) or is refused.
    # A subclass of a plain type (a namedtuple, a Counter, a str subclass) is
    # read through its base type's own C methods, which return an exact copy of
    # the stored data, so none of the program's methods (__eq__, __iter__,
    # __repr__ ...) runs and what is compared outside is the data itself.
    # Everything it uses is bound here, before the program exists.
    _int, _float, _complex, _bytes, _bool, _tuple, _set, _frozenset, _slice = (
        int, float, complex, bytes, bool, tuple, set, frozenset, slice)
    _issubclass, _none, _read = issubclass, None, os.read
    _type_name = _type.__dict__["__name__"].__get__
    _as_int, _as_float, _as_complex, _as_str = _int.__int__, _float.__float__, _complex.__pos__, _str.__str__
    _bytes_at, _tuple_at, _list_copy, _dict_items = _bytes.__getitem__, _tuple.__getitem__, _list.copy, _dict.items
    _set_iter, _frozenset_iter = _set.__iter__, _frozenset.__iter__
    _caps = plain_caps or {"depth": 0, "nodes": 0, "chars": 0}

    class _NotPlain(Exception):
        pass

    def type_name(obj):
        try:
            return _as_str(_type_name(_type(obj)))[:100]
        except _BaseException:
            return "?"

    def plain(x, depth, budget):
        # budget: [values left, characters of strings and bytes left]; both
        # stop a large result early, before it is copied or repr'd
        t = _type(x)
        budget[0] -= 1
        if budget[0] < 0:
            raise _NotPlain("more than " + _str(_caps["nodes"]) + " values")
        # identity only: "t in (...)" would ask the program's metaclass __eq__
        if (x is _none or t is _int or t is _float or t is _str or t is _bool or t is _bytes
                or t is _complex):
            if t is _str or t is _bytes:
                budget[1] -= _len(x)
                if budget[1] < 0:
                    raise _NotPlain("more than " + _str(_caps["chars"]) + " characters")
            return x
        if depth >= _caps["depth"]:
            raise _NotPlain("nested deeper than " + _str(_caps["depth"]))
        d = depth + 1
        if t is _list:
            return [plain(e, d, budget) for e in x]
        if t is _tuple:
            return _tuple([plain(e, d, budget) for e in x])
        if t is _dict:
            return {plain(k, d, budget): plain(v, d, budget) for k, v in _dict_items(x)}
        if t is _set:
            return _set([plain(e, d, budget) for e in x])
        if t is _frozenset:
            return _frozenset([plain(e, d, budget) for e in x])
        if _issubclass(t, _int):
            return _as_int(x)
        if _issubclass(t, _float):
            return _as_float(x)
        if _issubclass(t, _complex):
            return _as_complex(x)
        if _issubclass(t, _str):
            return _as_str(x)
        if _issubclass(t, _bytes):
            return _bytes_at(x, _slice(None))
        if _issubclass(t, _list):
            return [plain(e, d, budget) for e in _list_copy(x)]
        if _issubclass(t, _tuple):
            return _tuple([plain(e, d, budget) for e in _tuple_at(x, _slice(None))])
        if _issubclass(t, _dict):
            return {plain(k, d, budget): plain(v, d, budget) for k, v in _dict_items(x)}
        if _issubclass(t, _frozenset):
            return _frozenset([plain(e, d, budget) for e in _frozenset_iter(x)])
        if _issubclass(t, _set):
            return _set([plain(e, d, budget) for e in _set_iter(x)])
        raise _NotPlain("holds a " + type_name(x) if depth else None)

    def encode(value):
        """(kind, text): ("value", repr of the plain copy) or ("not_plain", what it is)."""
        try:
            text = _repr(plain(value, 0, [_caps["nodes"], _caps["chars"]]))
        except _NotPlain as exc:
            why = exc.args[0]
            return "not_plain", type_name(value) + (" (" + why + ")" if why else "")
        except _BaseException as exc:
            return "not_plain", type_name(value) + " (" + type_name(exc) + " while reading it)"
        if _len(text) > _caps["chars"]:
            return "not_plain", type_name(value) + " (more than " + _str(_caps["chars"]) + " characters)"
        return "value", text

    # Everything the harness will run after the model's code is compiled now,
    # before that code exists: nothing can read the tests' text as they compile.
    imports_code = _compile(imports, "<imports>", "exec")
    call_imports_code = _compile(call_imports, "<call imports>", "exec")
    test_codes: list = []   # (source, code or None, compile error or None)
    for src in tests:
        try:
            test_codes.append((src, _compile(src, "<test>", "exec"), None))
        except _BaseException as exc:
            test_codes.append((src, None, fmt(exc)))
    # The collector's callbacks list (the very object the collector calls,
    # whatever the gc module's attribute is later set to), thresholds and state.
    _gc_callbacks, _gc_saved = gc.callbacks, _list(gc.callbacks)
    _gc_threshold, _gc_disable, _gc_set_threshold = gc.get_threshold(), gc.disable, gc.set_threshold
    _exec(imports_code, {})
    clean_builtins = _dict(builtins.__dict__)
    # The module type's own __dict__ slot: a module whose __class__ the program
    # swaps cannot run code when we read its namespace back.
    _mdict = _type(sys).__dict__["__dict__"].__get__  # type: ignore[index]  # the class's mapping, a slot
    saved = [(name, mod, _dict(_mdict(mod))) for name, mod in _list(_modules.items())
             if _type(mod) is _type(sys)]
    ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        _exec(_compile(imports + "\n" + code, "solution.py", "exec"), ns)
    except _BaseException as exc:
        report({"stage": "solution", "error": fmt(exc), "total": _len(tests), "failed": None})
        _exit(1)
    _settrace(None)
    _setprofile(None)
    # No collection from here on: a gc callback, or a finalizer of the
    # program's cyclic garbage, would run the program's code again after the
    # restore below. Callbacks and thresholds go back to their values from
    # before the program; the tests run without automatic collection.
    try:
        _gc_disable()
        del _gc_callbacks[:]
        _gc_callbacks.extend(_gc_saved)
        _gc_set_threshold(*_gc_threshold)
    except _BaseException as exc:
        report({"stage": "solution", "error": "could not restore the collector: " + fmt(exc),
                "total": _len(tests), "failed": None})
        _exit(1)
    # A thread of the program's could re-patch what is restored below, between
    # the restore and a test; checked before the restore, so none can start later.
    try:
        n_threads = _len(_listdir("/proc/self/task"))
    except _BaseException:
        n_threads = 1
    if n_threads != 1:
        report({"stage": "solution", "error": "the program left threads running (" + _str(n_threads - 1)
                + " besides the harness's)", "total": _len(tests), "failed": None})
        _exit(1)
    # Old values stay referenced until we exit: dropping the last reference
    # could run a finalizer of the program's that re-patches what we restored.
    graveyard: list = []
    try:
        for name, mod, state in saved:
            _modules[name] = mod
            d = _mdict(mod)
            graveyard.append(_dict(d))
            _dict.update(d, state)
    except _BaseException as exc:
        report({"stage": "solution", "error": "could not restore module state: " + fmt(exc),
                "total": _len(tests), "failed": None})
        _exit(1)
    tns = {k: v for k, v in ns.items()
           if k in keep or k not in clean_builtins or v is clean_builtins[k]}
    tns["__builtins__"] = _dict(clean_builtins)
    _exec(imports_code, tns)
    if calls_mode:
        _exec(call_imports_code, tns)
        for name, target in alias.items():
            if target in tns:
                tns[name] = tns[target]
        pending = [b""]

        def take(n):
            while _len(pending[0]) < n:
                chunk = _read(cfd, 1 << 16)
                if not chunk:
                    return None
                pending[0] += chunk
            out, pending[0] = pending[0][:n], pending[0][n:]
            return out

        while True:
            # One request at a time, "<length>\n<seq> <token>\n<expression>";
            # the host closes the pipe after the last reply.
            head = b""
            while not head.endswith(b"\n"):
                c = take(1)
                if c is None:
                    _exit(0)
                head += c
            body = take(_int(head))
            if body is None:
                _exit(0)
            ident, src = body.decode("utf-8").split("\n", 1)
            seq, token = ident.split(" ")
            try:
                call_code = _compile(src, "<call>", "eval")
            except _BaseException as exc:
                frame(seq, token, "raised", type_name(exc))
                continue
            _settrace(None)
            _setprofile(None)
            try:
                value = _eval(call_code, tns)
            except _BaseException as exc:
                graveyard.append(exc)
                frame(seq, token, "raised", type_name(exc))
                continue
            # Kept referenced: a finalizer of the result runs no code before we exit.
            graveyard.append(value)
            kind, text = encode(value)
            frame(seq, token, kind, text)
    failed = []
    for src, test_code, compile_error in test_codes:
        _settrace(None)
        _setprofile(None)
        if test_code is None:
            failed.append({"test": src[:200], "error": compile_error})
            continue
        try:
            _exec(test_code, tns)
        except _BaseException as exc:
            failed.append({"test": src[:200], "error": fmt(exc)})
    report({"stage": "tests", "error": None, "total": _len(tests), "failed": failed})
    _exit(1 if failed else 0)


if __name__ == "__main__":   # run by the sandbox (``python -c``); importing this module runs nothing
    _pa_src = _pa_main()
    del _pa_main
    exec(compile(_pa_src, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
