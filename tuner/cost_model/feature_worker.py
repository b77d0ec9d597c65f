"""A feature worker: featurises the schedules the tuning process sends it (see parallel.py).

Messages, pickled on stdin/stdout: ("tasks", {key: (workload, target)}) adds tasks;
("features", key, [step list]) is answered with [features or None]. The pool kills it when done;
the end of stdin also ends it, and it never outlives the tuner (toolchain.process.die_with_parent).
"""
from __future__ import annotations

from ..task import Task
from ..toolchain.process import messages, serve
from .dataset import features_or_none


def main(channel) -> None:

    tasks: dict = {}
    built: dict = {}
    for msg in messages(channel):
        if msg[0] == "tasks":
            tasks.update(msg[1])
        elif msg[0] == "features":
            _, key, steps_list = msg
            task = built.get(key)
            if task is None:
                task = built[key] = Task(*tasks[key])
            channel.send([features_or_none(task, steps) for steps in steps_list])


if __name__ == "__main__":
    serve(main)
