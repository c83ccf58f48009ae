"""How `LocalPool` hands the search's `TrialInputs` to its worker processes: in memory.

Workers start before the inputs are ready (the FP32 reference outputs, the base
pipeline), so that both load their libraries at once. Each worker connects to a
`Handoff` in the search's process and blocks until the inputs are given; a worker that
is started later (after a crash, or for a confirmation) connects the same way.

The inputs travel over an ``AF_UNIX`` socket of `multiprocessing.connection`, in a
private temporary folder (mode 0700, not the output folder), with its HMAC challenge in
both directions: only a process that holds the 32-byte key, passed to the workers in
their start-up arguments, can connect or serve. The pickling is the multiprocessing
machinery's own, in memory; nothing a worker loads at start comes from a file, so a
results folder that someone else wrote cannot run code in a worker (SECURITY.md).
"""

from __future__ import annotations

import os
import socket
import threading
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.context import AuthenticationError

from routetune.candidate.records import TrialInputs

Address = str
"""The socket's path."""


class Handoff:
    """Serves one `TrialInputs` to every worker that connects, once it is given.

    Attributes:
        address: The socket's path, for `receive`.
        key: The authentication key (32 random bytes), for `receive`.
    """

    def __init__(self) -> None:
        self.key = os.urandom(32)
        self._listener = Listener(family="AF_UNIX", authkey=self.key)
        self.address: Address = str(self._listener.address)
        self._inputs: TrialInputs | None = None
        self._given = threading.Event()
        self._sending = threading.Lock()  # one pickled copy in memory at a time
        self._closed = False
        threading.Thread(target=self._serve, name="routetune-handoff", daemon=True).start()

    def give(self, inputs: TrialInputs) -> None:
        """Set the inputs: workers waiting get them now, later ones on connecting."""
        self._inputs = inputs
        self._given.set()

    def close(self) -> None:
        """Stop serving; a worker still waiting gets `EOFError` and reports it per trial."""
        if self._closed:
            return
        self._closed = True
        self._given.set()
        try:  # wake the accepting thread (closing a socket does not, on Linux)
            with socket.socket(socket.AF_UNIX) as wake:
                wake.connect(self.address)
        except OSError:
            pass
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn: Connection | None = self._listener.accept()
            except (AuthenticationError, EOFError, ConnectionError):
                conn = None  # not one of our workers (or `close` waking us): nothing sent
            except OSError:  # closed
                return
            if self._closed:
                if conn is not None:
                    conn.close()
                return
            if conn is not None:
                threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: Connection) -> None:
        with conn:
            self._given.wait()
            if self._closed or self._inputs is None:
                return
            with self._sending:
                try:
                    conn.send(self._inputs)
                except OSError:  # the worker died meanwhile
                    pass


def receive(address: Address, key: bytes) -> TrialInputs:
    """In a worker: connect to the search's `Handoff` and wait for its inputs.

    Raises:
        EOFError: The search stopped serving before it gave the inputs.
        multiprocessing.AuthenticationError: The key is not the server's.
        TypeError: What came is not a `TrialInputs`.
    """
    with Client(address, family="AF_UNIX", authkey=key) as conn:
        inputs = conn.recv()
    if not isinstance(inputs, TrialInputs):
        raise TypeError(f"the search sent a {type(inputs).__name__}, not TrialInputs")
    return inputs
