"""RequestContext releases: all of a request's (children included) under its guard, each registration once."""

from __future__ import annotations

import threading

from omni_stream.context import RequestContext


def held_elsewhere(lock: threading.Condition) -> bool:
    """Whether another thread finds ``lock`` taken (what the worker would find when it schedules a step)."""
    result = []

    def probe() -> None:
        got = lock.acquire(blocking=False)
        if got:
            lock.release()
        result.append(not got)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result[0]


def test_release_now_runs_the_request_s_and_its_children_s_releases_under_the_guard():
    guard = threading.Condition()
    ctx = RequestContext(guard=guard)
    child = ctx.child("req.0")
    grandchild = child.child("req.0.0")
    assert child.guard is guard and grandchild.guard is guard
    seen: list[tuple[str, bool]] = []
    for name, owner in (("parent", ctx), ("child", child), ("grandchild", grandchild)):
        owner.add_release(lambda name=name: seen.append((name, held_elsewhere(guard))))
    assert not held_elsewhere(guard)
    ctx.release_now()
    assert sorted(seen) == [("child", True), ("grandchild", True), ("parent", True)]
    assert not held_elsewhere(guard)
    ctx.release_now()  # each registration runs once
    assert len(seen) == 3


def test_release_now_without_a_guard_runs_the_releases():
    ctx = RequestContext()
    seen = []
    ctx.add_release(lambda: seen.append(1))
    ctx.cancel()
    assert seen == [1] and ctx.cancelled


def test_a_stale_unregister_never_removes_a_later_registration_of_the_same_release():
    ctx = RequestContext()
    seen = []

    def release() -> None:
        seen.append(len(seen))

    stale = ctx.add_release(release)
    ctx.release_now()
    ctx.add_release(release)  # the same callable registered again (a new session reusing a release)
    stale()  # the first registration's owner unregisters late: it must not drop the second
    ctx.release_now()
    assert seen == [0, 1]


def test_unregister_removes_its_own_registration():
    ctx = RequestContext()
    seen = []
    unregister = ctx.add_release(lambda: seen.append("a"))
    ctx.add_release(lambda: seen.append("b"))
    unregister()
    ctx.release_now()
    assert seen == ["b"]


def test_a_child_released_on_its_own_leaves_the_parent_s_list():
    ctx = RequestContext()
    child = ctx.child("req.0")
    seen = []
    child.add_release(lambda: seen.append("child"))
    child.release_now()
    ctx.release_now()
    assert seen == ["child"]
