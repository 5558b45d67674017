"""The tap: each vLLM method the trace observes is wrapped once, and every checker subscribes.

``Tap.around(owner, name, fn)`` subscribes ``fn(call, *args, **kwargs)`` to the calls of
``owner.<name>`` (a bound method of one of vLLM's objects: the connector's scheduler, the
tier's manager, the KV-cache manager, ...). The first subscription installs one wrapper on
the instance; later ones join it. A call runs through the subscribers as nested wrappers in
subscription order, the first subscribed innermost (nearest vLLM's method), each handed
``call``, the next one in (which it calls, with the same or changed arguments, or not at
all), and returning what the caller gets. A method already wrapped by another tap is refused
(``TapError``): no vLLM method is wrapped twice by the trace. (The plugin's capture,
``capture.install``, wraps a serving engine's tier ``prepare_load`` on its own; where both run
in one process, as tests/test_plugin.py drives them, the tap wraps over it.)

``publish(event, *args)`` / ``subscribe(event, fn)``: the engine's own events that are no
vLLM method (the fake model runner's block copies and forward), in subscription order.

Standard library only.
"""

import functools

TAPPED = "__kvbound_tap__"  # the attribute that marks a tap's wrapper (its value: the tap)


class TapError(RuntimeError):
    """A second wrap of one method: a harness fault."""


class _Hook:
    __slots__ = ("owner", "name", "orig", "subscribers")

    def __init__(self, owner, name, orig):
        self.owner, self.name, self.orig, self.subscribers = owner, name, orig, []

    def call(self, i, a, k):
        if i < 0:
            return self.orig(*a, **k)
        return self.subscribers[i](lambda *a2, **k2: self.call(i - 1, a2, k2), *a, **k)


class Tap:
    def __init__(self):
        self.hooks = {}  # (id(owner), name) -> _Hook
        self.events = {}  # event -> [fn]

    def around(self, owner, name, fn):
        """``fn(call, *a, **k)`` around every call of ``owner.<name>`` (see the module doc)."""
        key = (id(owner), name)
        hook = self.hooks.get(key)
        if hook is None:
            hook = self.hooks[key] = self._install(owner, name)
        hook.subscribers.append(fn)

    def _install(self, owner, name):
        orig = getattr(owner, name)
        if getattr(orig, TAPPED, None) is not None:
            raise TapError("%s.%s is wrapped by another tap already" % (type(owner).__name__, name))
        hook = _Hook(owner, name, orig)

        @functools.wraps(orig)
        def tapped(*a, **k):
            return hook.call(len(hook.subscribers) - 1, a, k)

        setattr(tapped, TAPPED, self)
        setattr(owner, name, tapped)
        return hook

    def wrapped(self):
        """(owner, name, vLLM's method) of every wrapped method, in installation order."""
        return [(h.owner, h.name, h.orig) for h in self.hooks.values()]

    # -- events that are no vLLM method ---------------------------------------------------------
    def subscribe(self, event, fn):
        self.events.setdefault(event, []).append(fn)

    def publish(self, event, *a):
        for fn in self.events.get(event, ()):
            fn(*a)
