"""The Spark edge: the waits over DataFrames, their plan, the tasks, parked state, metrics.

The public names are exported by the top-level package (``from keyed_async_wait import
AsyncDataStream``). Nothing is imported here: a Python worker unpickling a task imports only
the task side (:mod:`.task`, :mod:`.worker`, :mod:`.plan`), not the driver's API.
"""
