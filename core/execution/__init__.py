"""Where trials run: the executor interface, in this process or on worker processes.

`routetune.execution.builtin` registers the built-in executors (``local``,
``in-process``) through the ``routetune_register_executors`` hook, as a plugin's
executor registers.
"""

DEFAULT_TIMEOUT_S = 1800.0
"""Default per-phase timeout in seconds (``--trial-timeout``): a large TensorRT build at
optimisation level 5 can take many minutes; a hang still ends."""
