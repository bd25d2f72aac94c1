"""Built-in primitives: plain functions ``fn(sch, *args, **kwargs)`` over a schedule node.

``autoslapo.schedule.Schedule`` binds each one as a method (``sch.shard(...)``, ``sch.checkpoint()``,
...). These modules import ``Schedule`` only for type checking, so importing a primitive module
never imports the schedule, and the schedule imports them at its top without a cycle.
"""
