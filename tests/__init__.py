"""sessionlog's tests.

Rules: every store lives in `tmp_path` on the real disk with real fsync; sockets
bind 127.0.0.1 on port 0; durability tests kill real subprocesses with SIGKILL;
the 250 ms throttle and the 5 s debounce run under trio's autojump clock; every
test that does I/O has a `fail_after`; tests check behaviour, never wall-clock
time (speed lives in bench/). HOME is the temp folder (conftest.py), so that
projects in any tmp_path lie under the default project root.
"""
