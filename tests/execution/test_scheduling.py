"""The pieces both executors share: the job feed and the tail of a dead worker's log."""

from __future__ import annotations

from routetune.execution.executor import Job
from routetune.execution.scheduling import LOOKAHEAD, JobFeed, log_tail
from routetune.routes.route import Route, Step


def test_a_timeout_dump_names_the_main_thread_where_a_ray_worker_has_several() -> None:
    text = ("== 12:00:00 pid 1: build x\nTimeout (0:00:03)!\n"
            "Thread 0x1 (most recent call first):\n  File \"threading.py\", line 629 in wait\n"
            "Thread 0x2 (most recent call first):\n  File \"chaos.py\", line 63 in apply\n"
            "  File \"app.py\", line 3 in step\n  File \"main.py\", line 1 in main\n")
    assert log_tail(text, "log x.log") == (
        '; stderr: Timeout (0:00:03)! | File "chaos.py", line 63 in apply | '
        'File "app.py", line 3 in step (log x.log)')


def test_a_fatal_signal_names_the_thread_that_faulted() -> None:
    text = ("== 12:00:00 pid 1: measure x\nearlier\n== 12:00:01 pid 1: build y\n"
            "Fatal Python error: Segmentation fault\n\n"
            "Current thread 0x2 (most recent call first):\n  File \"chaos.py\", line 52 in apply\n"
            "Thread 0x1 (most recent call first):\n  File \"threading.py\", line 629 in wait\n")
    assert log_tail(text, "w") == ('; stderr: Fatal Python error: Segmentation fault | '
                                   'File "chaos.py", line 52 in apply (w)')
    assert log_tail("== 12:00:00 pid 1: build x\n", "w") == "; stderr empty (w)"


def test_a_job_waits_for_the_build_of_its_model_prefix() -> None:
    def job(*names: str) -> Job:
        route = Route(tuple(Step(n) for n in names))
        return Job(route, "-".join(names), route)

    feed = JobFeed(iter([job("fp16"), job("fp16", "nhwc"), job("fold")]))
    first = feed.next_ready([])
    assert first == job("fp16")
    assert feed.next_ready([first]) == job("fold")  # fp16,nhwc waits for fp16
    assert feed.next_ready([first]) is None and not feed.exhausted()
    assert feed.next_ready([]) == job("fp16", "nhwc") and feed.exhausted()
    many = JobFeed(iter([job("a", str(i)) for i in range(LOOKAHEAD + 5)]))
    assert many.next_ready([job("a")]) is None and len(many.pending) == LOOKAHEAD
