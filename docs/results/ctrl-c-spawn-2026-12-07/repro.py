"""Spawn workers in a loop under spawning_quietly while another thread has SIGINT unblocked."""
import multiprocessing
import signal
import sys
import threading
import time

import pebble

from routetune import signals

armed = []

def on_int(s, f):
    if armed:
        raise KeyboardInterrupt

def noop(): pass

if __name__ == "__main__":
    signal.signal(signal.SIGINT, on_int)
    threading.Thread(target=lambda: time.sleep(1e6), daemon=True).start()  # SIGINT unblocked
    ctx = multiprocessing.get_context("spawn")
    interrupted = spawned = 0
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        pool = None
        try:
            armed.append(1)
            with signals.spawning_quietly():
                pool = pebble.ProcessPool(2, context=ctx)
                pool.schedule(noop)
                spawned += 2
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            armed.clear()
            if pool is not None:
                pool.stop()
                pool.join()
    print("spawned", spawned, "interrupts", interrupted, file=sys.stderr)
